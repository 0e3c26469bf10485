// cluster_env.hpp — this node's place in a multi-node job, read from the environment that
// Slurm or Kubernetes (Kubeflow's PyTorchJob and Trainer) give the process, for when no flag
// or config file says. Pure functions: an environment map in, a topology out.
//
// What is read, and why (docs/multinode.md, "Slurm and Kubernetes", has the same as a table):
//
// Slurm, when SLURM_JOB_ID is set. airhost runs once per node (srun --ntasks-per-node=1):
//   nnodes        SLURM_STEP_NUM_NODES, else SLURM_NNODES, else SLURM_JOB_NUM_NODES (inside
//                 srun the step's count: a step may use fewer nodes than the job)
//   node_rank     SLURM_NODEID (the node's index in the step)
//   master_addr   MASTER_ADDR if the job's environment has it, else the first host of
//                 SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST)
//   master_port   MASTER_PORT if set, else 20000 + SLURM_JOB_ID % 10000: the same on every
//                 node with no exchange, below Linux's ephemeral range (32768-60999), and
//                 different for jobs whose ids differ by less than 10000
//   accelerators  SLURM_GPUS_ON_NODE when above 0 (Slurm also sets CUDA_VISIBLE_DEVICES to
//                 the allocated GPUs, which airhost honours anyway)
//   A one-node job keeps the loopback address and a free port unless MASTER_ADDR/MASTER_PORT
//   say otherwise: no other node has to reach it, and a free port cannot collide with
//   another job's on a shared node.
//   Refused (ConfigError, exit 2): several tasks on a node (SLURM_STEP_TASKS_PER_NODE above
//   1, SLURM_LOCALID above 0, or SLURM_NTASKS_PER_NODE above 1): each airhost would start
//   every rank of the node; and a multi-node allocation used outside srun (the batch script
//   or salloc shell itself, SLURM_STEP_ID unset or "batch"/"extern"-like), where only one
//   node would ever join.
//
// Kubeflow training operator v1 PyTorchJob (pkg/controller.v1/pytorch/envvar.go and
// master.go, last in kubeflow/training-operator before commit 7858371, v1.9): with a Master
// replica every pod gets MASTER_ADDR = PET_MASTER_ADDR = "<job>-master-0", MASTER_PORT =
// PET_MASTER_PORT = the master's "pytorchjob-port" (23456 by default), RANK = PET_NODE_RANK =
// the replica index (master 0, worker i+1), PET_NNODES = the replica count ("min:max"
// under an elasticPolicy), PET_NPROC_PER_NODE = spec.nprocPerNode ("auto" by default) and
// WORLD_SIZE = replicas * nprocPerNode (1 for "auto"). Operators before v1.7 set only
// MASTER_ADDR, MASTER_PORT, WORLD_SIZE = replicas and RANK = replica index. Kubeflow Trainer
// v2 (pkg/runtime/framework/plugins/torch/torch.go) sets only PET_NNODES,
// PET_NPROC_PER_NODE, PET_NODE_RANK (the Job completion index), PET_MASTER_ADDR and
// PET_MASTER_PORT (29500). PET_* are torchrun's own environment form of its flags.
//   nnodes        PET_NNODES ("n", or "min:max": an elastic job, as --nnodes MIN:MAX);
//                 legacy: WORLD_SIZE
//   node_rank     PET_NODE_RANK; legacy: RANK
//   master_addr   PET_MASTER_ADDR, else MASTER_ADDR
//   master_port   PET_MASTER_PORT, else MASTER_PORT
//   accelerators  PET_NPROC_PER_NODE when a number; "auto", "gpu" and "cpu" leave airhost's
//                 own default (one rank per visible GPU, or 1 without GPUs)
//   Source "kubernetes" when KUBERNETES_SERVICE_HOST is set (every pod has it), else
//   "torchrun-style env" for PET_* exported by hand. The legacy WORLD_SIZE/RANK reading
//   only applies inside Kubernetes, with MASTER_ADDR set, without PET_NNODES, and without
//   LOCAL_RANK (which would make them a launcher's per-process values).
//
// AIRHOST_DETECT=0 turns detection off.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/config.hpp"

namespace airhost::detail {

using EnvMap = std::map<std::string, std::string>;

// Slurm's compressed host list → the host names, in order. Grammar (Slurm's hostlist.c, as
// `scontrol show hostnames` reads it): comma-separated entries; in an entry, each `[...]`
// group is a comma-separated list of numbers and LOW-HIGH ranges, and an entry with several
// groups is their cartesian product, left group outermost ("a[1-2]-b[3-4]" → a1-b3 a1-b4
// a2-b3 a2-b4). A range keeps the width of LOW, so "gpu[01-04,07]" → gpu01..gpu04 gpu07 and
// "n[9-11]" → n9 n10 n11. Empty entries ("a,,b") are skipped as Slurm skips them. Text
// after the last bracket ("n[1-2].x") is accepted, though Slurm 22.05 itself never writes it.
// Throws ConfigError naming the list and the fault: empty list, unclosed or stray bracket,
// empty or non-numeric range, reversed range (HIGH < LOW), more than 100000 hosts.
std::vector<std::string> expand_slurm_hostlist(std::string_view list);

// SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE: "2(x3),1" → {2, 2, 2, 1}.
// Throws ConfigError on anything else.
std::vector<int> expand_slurm_tasks_per_node(std::string_view text);

// What the environment says about the job. Every field is optional: only what was found.
struct ClusterTopology {
  std::string source;                   // "slurm", "kubernetes", "torchrun-style env"; "" = none
  std::string evidence;                 // what identified it: "SLURM_JOB_ID=42"
  std::optional<int> nnodes;
  std::optional<int> nnodes_min;  // PET_NNODES=MIN:MAX: an elastic job
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<int> accelerators;
  std::map<std::string, std::string> why;  // setting name → the variables it came from
  std::vector<std::string> notes;          // what was read but deliberately not used, and why
};

// Reads `env`. Throws ConfigError (exit 2) for values that are there but wrong: a node list
// that does not parse, a non-number, several airhosts per Slurm node, an elastic range.
ClusterTopology detect_cluster(const EnvMap& env);

// This process's environment as a map.
EnvMap current_environment_map();

// The settings a launch uses for the values detection can give, and where each came from.
struct ClusterResolution {
  Settings settings;                         // `merged` with detected values filled in
  ClusterTopology topology;
  std::map<std::string, std::string> origin; // "nnodes" etc. → "flag", "config FILE",
                                             //   "slurm: SLURM_NNODES=2", "default"
};

// Layers detection under explicit settings: a flag wins, then a config file value, then
// what `topology` found, then the built-in default. `flags` are the command line's
// settings alone, `merged` the file's with the flags over them (HostOptions::settings).
// `accelerators = 0` and `master_port = 0` mean "automatic" wherever they are given, so
// they leave the choice to detection, which falls back to the same defaults.
ClusterResolution resolve_cluster(const Settings& flags, const Settings& merged, const std::string& config_path,
                                  const ClusterTopology& topology);

}  // namespace airhost::detail
