// cluster_env.cpp — Slurm and Kubernetes environments → topology (see cluster_env.hpp for
// every variable read and the sources they were checked against).
#include "cli/cluster_env.hpp"

#include <charconv>
#include <climits>

#include "base/util.hpp"

namespace airhost::detail {

namespace {

constexpr std::size_t kMaxHosts = 100000;


std::optional<long long> to_integer(std::string_view text) {
  long long value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

std::string pad(unsigned long long n, std::size_t width) {
  std::string s = std::to_string(n);
  if (s.size() < width) s.insert(0, width - s.size(), '0');
  return s;
}

[[noreturn]] void bad_hostlist(std::string_view list, const std::string& why) {
  throw ConfigError("cannot read the Slurm node list " + single_quoted(list) + ": " + why +
                    "; expected host names and bracket ranges like gpu[01-04,07]");
}

// The numbers of one bracket group's inside ("01-04,07"), formatted with their widths.
std::vector<std::string> expand_group(std::string_view list, std::string_view inside) {
  std::vector<std::string> out;
  if (inside.empty()) bad_hostlist(list, "empty brackets []");
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = inside.find(',', start);
    const std::string_view item = inside.substr(start, comma == std::string_view::npos ? comma : comma - start);
    const std::size_t dash = item.find('-');
    const std::string_view lo = item.substr(0, dash);
    const std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi)) {
      bad_hostlist(list, item.empty() ? "an empty range in [" + std::string(inside) + "]"
                                      : "range " + single_quoted(item) + " is not NUMBER or LOW-HIGH");
    }
    if (lo.size() > 18 || hi.size() > 18) bad_hostlist(list, "range " + single_quoted(item) + " has too many digits");
    const auto a = std::stoull(std::string(lo));
    const auto b = std::stoull(std::string(hi));
    if (b < a) bad_hostlist(list, "range " + single_quoted(item) + " goes backwards (" + std::string(hi) + " < " + std::string(lo) + ")");
    if (b - a >= kMaxHosts || out.size() + (b - a) >= kMaxHosts)
      bad_hostlist(list, "more than " + std::to_string(kMaxHosts) + " hosts");
    for (auto n = a; n <= b; ++n) out.push_back(pad(n, lo.size()));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

// One entry: literal text and bracket groups, expanded as a cartesian product.
void expand_entry(std::string_view list, std::string_view entry, std::vector<std::string>& out) {
  std::vector<std::string> names = {""};
  std::size_t i = 0;
  while (i < entry.size()) {
    if (entry[i] == ']') bad_hostlist(list, "a ']' without its '[' in " + single_quoted(entry));
    if (entry[i] != '[') {
      const std::size_t next = entry.find_first_of("[]", i);
      const std::string_view text = entry.substr(i, next == std::string_view::npos ? next : next - i);
      for (auto& n : names) n += text;
      i += text.size();
      continue;
    }
    const std::size_t close = entry.find(']', i);
    if (close == std::string_view::npos) bad_hostlist(list, "a '[' is never closed in " + single_quoted(entry));
    const std::string_view inside = entry.substr(i + 1, close - i - 1);
    if (inside.find('[') != std::string_view::npos) bad_hostlist(list, "brackets inside brackets in " + single_quoted(entry));
    const auto numbers = expand_group(list, inside);
    if (names.size() * numbers.size() + out.size() > kMaxHosts)
      bad_hostlist(list, "more than " + std::to_string(kMaxHosts) + " hosts");
    std::vector<std::string> product;
    product.reserve(names.size() * numbers.size());
    for (const auto& n : names)
      for (const auto& num : numbers) product.push_back(n + num);
    names = std::move(product);
    i = close + 1;
  }
  for (auto& n : names) {
    for (char c : n)
      if (c == ' ' || c == '\t' || c == '\n') bad_hostlist(list, "host name " + single_quoted(n) + " contains white space");
    out.push_back(std::move(n));
  }
}

// A positive or non-negative integer variable; nullopt when absent.
std::optional<int> int_var(const EnvMap& env, const std::string& name, int min) {
  const auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  const auto n = to_integer(it->second);
  if (!n || *n < min || *n > INT_MAX) {
    throw ConfigError(name + "=" + single_quoted(it->second) + " in the environment is not " +
                      (min > 0 ? "a positive integer" : "a non-negative integer") +
                      "; fix or unset it, or give the value as a flag");
  }
  return static_cast<int>(*n);
}

const std::string* var(const EnvMap& env, const std::string& name) {
  const auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

std::optional<int> port_var(const EnvMap& env, const std::string& name) {
  const auto p = int_var(env, name, 0);
  if (p && (*p < 1 || *p > 65535))
    throw ConfigError(name + "=" + std::to_string(*p) + " in the environment is not a port from 1 to 65535");
  return p;
}

std::string kv(const std::string& name, const std::string& value) { return name + "=" + value; }

// The first of `names` that is set, with its name.
std::optional<std::pair<std::string, std::string>> first_var(const EnvMap& env, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const auto* v = var(env, n)) return std::make_pair(std::string(n), *v);
  return std::nullopt;
}

constexpr std::string_view kOneTaskPerNode =
    "airhost starts every rank of its node itself, so Slurm must run exactly one airhost per node: "
    "srun --ntasks-per-node=1 airhost train.py (and #SBATCH --ntasks-per-node=1)";

ClusterTopology detect_slurm(const EnvMap& env) {
  ClusterTopology t;
  t.source = "slurm";
  t.evidence = kv("SLURM_JOB_ID", env.at("SLURM_JOB_ID"));
  const auto job_id = to_integer(env.at("SLURM_JOB_ID"));
  if (!job_id || *job_id < 0)
    throw ConfigError("SLURM_JOB_ID=" + single_quoted(env.at("SLURM_JOB_ID")) + " in the environment is not a job number");

  // Several airhosts on one node: each would start all of the node's ranks.
  if (const auto* tpn = var(env, "SLURM_STEP_TASKS_PER_NODE")) {
    for (int n : expand_slurm_tasks_per_node(*tpn))
      if (n > 1)
        throw ConfigError("this Slurm step runs " + std::to_string(n) + " tasks on a node (" +
                          kv("SLURM_STEP_TASKS_PER_NODE", *tpn) + "); " + std::string(kOneTaskPerNode));
  }
  if (const auto local = int_var(env, "SLURM_LOCALID", 0); local && *local > 0)
    throw ConfigError("this is task " + std::to_string(*local) + " of its node (SLURM_LOCALID=" + std::to_string(*local) +
                      "); " + std::string(kOneTaskPerNode));
  // Not SLURM_NTASKS_PER_NODE: a step inherits the batch script's (#SBATCH
  // --ntasks-per-node=8 then srun --ntasks-per-node=1 is right), while the two above are
  // the step's own.

  // Inside srun: the step's own node count and list; outside (the batch script, an salloc
  // shell) only the allocation's.
  // The batch script's and the extern step's ids are 0xFFFFFFFx, not real steps.
  const auto* step_id = var(env, "SLURM_STEP_ID");
  const auto step = step_id ? to_integer(*step_id) : std::nullopt;
  const bool in_step = step && *step >= 0 && *step < 0xFFFFFFF0LL;
  std::optional<int> nnodes;
  for (const char* name : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}) {
    if (!in_step && std::string_view(name) == "SLURM_STEP_NUM_NODES") continue;
    if ((nnodes = int_var(env, name, 1))) {
      t.why["nnodes"] = kv(name, std::to_string(*nnodes));
      break;
    }
  }
  if (!in_step && nnodes && *nnodes > 1) {
    throw ConfigError("airhost is running in a " + std::to_string(*nnodes) +
                      "-node Slurm allocation but outside srun (SLURM_STEP_ID is not set), so the other nodes would "
                      "never join; start it on every node with srun --ntasks-per-node=1 airhost train.py");
  }
  t.nnodes = nnodes.value_or(1);
  if (!nnodes) t.why["nnodes"] = "no SLURM_NNODES: 1";

  if (const auto id = int_var(env, "SLURM_NODEID", 0)) {
    t.node_rank = *id;
    t.why["node_rank"] = kv("SLURM_NODEID", std::to_string(*id));
  } else {
    t.node_rank = 0;
    t.why["node_rank"] = "no SLURM_NODEID: 0";
  }
  if (*t.node_rank >= *t.nnodes)
    throw ConfigError("SLURM_NODEID=" + std::to_string(*t.node_rank) + " is not below the node count (" +
                      t.why["nnodes"] + ")");

  // The node list is read whatever the node count, so a bad one is said at once.
  const auto list = in_step ? first_var(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
                            : first_var(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  std::vector<std::string> hosts;
  if (list) hosts = expand_slurm_hostlist(list->second);
  if (list && hosts.empty()) bad_hostlist(list->second, "it names no host");

  const bool multi = *t.nnodes > 1;
  if (const auto* addr = var(env, "MASTER_ADDR"); addr && !addr->empty()) {
    t.master_addr = *addr;
    t.why["master_addr"] = kv("MASTER_ADDR", *addr) + " (set in the job's environment)";
  } else if (multi) {
    if (!list)
      throw ConfigError("a " + std::to_string(*t.nnodes) +
                        "-node Slurm step without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: airhost cannot tell the "
                        "first node; give --master-addr");
    t.master_addr = hosts.front();
    t.why["master_addr"] = "first host of " + kv(list->first, list->second);
  }
  if (const auto port = port_var(env, "MASTER_PORT")) {
    t.master_port = *port;
    t.why["master_port"] = kv("MASTER_PORT", std::to_string(*port)) + " (set in the job's environment)";
  } else if (multi) {
    t.master_port = static_cast<int>(20000 + *job_id % 10000);
    t.why["master_port"] = "20000 + SLURM_JOB_ID % 10000 (" + t.evidence + ")";
  }
  if (!multi && (!t.master_addr || !t.master_port))
    t.notes.push_back("one node: the rendezvous stays on this node (127.0.0.1, a free port) unless "
                      "MASTER_ADDR/MASTER_PORT are set");

  if (const auto gpus = int_var(env, "SLURM_GPUS_ON_NODE", 0); gpus && *gpus > 0) {
    t.accelerators = *gpus;
    t.why["accelerators"] = kv("SLURM_GPUS_ON_NODE", std::to_string(*gpus));
  }
  return t;
}

// PET_* (Kubeflow, torchrun) or, in Kubernetes only, the legacy WORLD_SIZE/RANK.
std::optional<ClusterTopology> detect_pet(const EnvMap& env) {
  const bool k8s = var(env, "KUBERNETES_SERVICE_HOST") != nullptr;
  const auto* pet_nnodes = var(env, "PET_NNODES");
  const bool legacy = k8s && !pet_nnodes && var(env, "MASTER_ADDR") && var(env, "WORLD_SIZE") && var(env, "RANK") &&
                      !var(env, "LOCAL_RANK");
  if (!pet_nnodes && !legacy) return std::nullopt;

  ClusterTopology t;
  t.source = k8s ? "kubernetes" : "torchrun-style env";
  if (pet_nnodes) {
    t.evidence = kv("PET_NNODES", *pet_nnodes) + (k8s ? " and KUBERNETES_SERVICE_HOST" : "");
    // "N", or an elastic policy's "MIN:MAX" (minReplicas:maxReplicas).
    const auto range = parse_node_count(*pet_nnodes);
    if (!range)
      throw ConfigError("PET_NNODES=" + single_quoted(*pet_nnodes) + " in the environment is not N or MIN:MAX "
                        "(1 <= MIN <= MAX)");
    t.nnodes = range->second;
    if (range->first != range->second) t.nnodes_min = range->first;
    t.why["nnodes"] = kv("PET_NNODES", *pet_nnodes);
    if (const auto r = int_var(env, "PET_NODE_RANK", 0)) {
      t.node_rank = *r;
      t.why["node_rank"] = kv("PET_NODE_RANK", std::to_string(*r));
    }
  } else {
    t.evidence = "WORLD_SIZE, RANK and MASTER_ADDR with KUBERNETES_SERVICE_HOST (a PyTorchJob of operator < v1.7)";
    t.nnodes = int_var(env, "WORLD_SIZE", 1);
    t.why["nnodes"] = kv("WORLD_SIZE", std::to_string(*t.nnodes)) + " (the job's replicas)";
    t.node_rank = int_var(env, "RANK", 0);
    t.why["node_rank"] = kv("RANK", std::to_string(*t.node_rank)) + " (the replica's index)";
  }
  if (!t.node_rank) {
    if (*t.nnodes > 1)
      throw ConfigError(t.why["nnodes"] + " but PET_NODE_RANK is not set, so airhost cannot tell which node this is; "
                        "use a PyTorchJob with a Master replica (it sets PET_NODE_RANK), or give --node-rank");
    t.node_rank = 0;
    t.why["node_rank"] = "no PET_NODE_RANK: 0";
  }
  if (*t.node_rank >= *t.nnodes)
    throw ConfigError(t.why["node_rank"] + " is not below the node count (" + t.why["nnodes"] + ")");

  if (const auto v = first_var(env, {"PET_MASTER_ADDR", "MASTER_ADDR"}); v && !v->second.empty()) {
    t.master_addr = v->second;
    t.why["master_addr"] = kv(v->first, v->second);
  }
  for (const char* name : {"PET_MASTER_PORT", "MASTER_PORT"}) {
    if (const auto p = port_var(env, name)) {
      t.master_port = *p;
      t.why["master_port"] = kv(name, std::to_string(*p));
      break;
    }
  }
  if (*t.nnodes > 1 && !t.master_addr)
    throw ConfigError(t.why["nnodes"] + " but neither PET_MASTER_ADDR nor MASTER_ADDR is set; give --master-addr");
  if (*t.nnodes > 1 && !t.master_port)
    throw ConfigError(t.why["nnodes"] + " but neither PET_MASTER_PORT nor MASTER_PORT is set; give --master-port");

  if (const auto* nproc = var(env, "PET_NPROC_PER_NODE")) {
    if (*nproc == "auto" || *nproc == "gpu" || *nproc == "cpu") {
      t.notes.push_back(kv("PET_NPROC_PER_NODE", *nproc) + ": airhost's default, one rank per visible GPU (1 without GPUs)");
    } else {
      t.accelerators = int_var(env, "PET_NPROC_PER_NODE", 1);
      t.why["accelerators"] = kv("PET_NPROC_PER_NODE", *nproc);
    }
  }
  if (pet_nnodes && var(env, "WORLD_SIZE"))
    t.notes.push_back("WORLD_SIZE=" + env.at("WORLD_SIZE") + " is ignored: with PET_NNODES set it counts processes, "
                      "and airhost sets the ranks' WORLD_SIZE itself");
  return t;
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(std::string_view list) {
  std::vector<std::string> out;
  std::size_t i = 0, depth_start = 0;
  bool open = false;
  // Split at the commas outside brackets.
  for (std::size_t j = 0; j <= list.size(); ++j) {
    if (j < list.size() && list[j] == '[') {
      if (open) bad_hostlist(list, "brackets inside brackets");
      open = true;
      depth_start = j;
    } else if (j < list.size() && list[j] == ']') {
      open = false;
    } else if (j == list.size() || (list[j] == ',' && !open)) {
      if (j == list.size() && open)
        bad_hostlist(list, "the '[' at character " + std::to_string(depth_start + 1) + " is never closed");
      if (j > i) expand_entry(list, list.substr(i, j - i), out);
      i = j + 1;
    }
  }
  if (out.empty()) bad_hostlist(list, "it names no host");
  return out;
}

std::vector<int> expand_slurm_tasks_per_node(std::string_view text) {
  std::vector<int> out;
  const auto bad = [&] {
    return ConfigError("cannot read the Slurm tasks per node " + single_quoted(text) + "; expected counts like 2(x3),1");
  };
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    std::string_view item = text.substr(start, comma == std::string_view::npos ? comma : comma - start);
    long long times = 1;
    if (const auto paren = item.find('('); paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')') throw bad();
      const auto t = to_integer(item.substr(paren + 2, item.size() - paren - 3));
      if (!t || *t < 1 || *t > static_cast<long long>(kMaxHosts)) throw bad();
      times = *t;
      item = item.substr(0, paren);
    }
    const auto n = to_integer(item);
    if (!n || *n < 0 || *n > INT_MAX || out.size() + times > kMaxHosts) throw bad();
    out.insert(out.end(), static_cast<std::size_t>(times), static_cast<int>(*n));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

ClusterTopology detect_cluster(const EnvMap& env) {
  if (const auto* off = var(env, "AIRHOST_DETECT"); off && *off == "0") {
    ClusterTopology t;
    t.notes.push_back("AIRHOST_DETECT=0: Slurm and Kubernetes variables are not read");
    return t;
  }
  if (var(env, "SLURM_JOB_ID")) return detect_slurm(env);
  if (auto t = detect_pet(env)) return *t;
  return {};
}

EnvMap current_environment_map() {
  EnvMap env;
  for (const auto& e : current_environment()) {
    const auto eq = e.find('=');
    if (eq != std::string::npos && eq > 0) env.emplace(e.substr(0, eq), e.substr(eq + 1));
  }
  return env;
}

ClusterResolution resolve_cluster(const Settings& flags, const Settings& merged, const std::string& config_path,
                                  const ClusterTopology& topology) {
  ClusterResolution r;
  r.settings = merged;
  r.topology = topology;
  const std::string config = "config " + (config_path.empty() ? std::string("file") : config_path);
  const std::string detected = topology.source.empty() ? "" : topology.source + ": ";
  // One setting: the first layer that gives it, where `given` says whether a layer does.
  auto layer = [&](const char* name, auto member, auto given, const auto& found) {
    if (given(flags.*member)) {
      r.origin[name] = "flag";
    } else if (given(merged.*member)) {
      r.origin[name] = config;
    } else if (found) {
      r.settings.*member = *found;
      r.origin[name] = detected + topology.why.at(name);
    } else {
      r.origin[name] = "default";
    }
  };
  const auto set = [](const auto& v) { return v.has_value(); };
  const auto set_nonzero = [](const std::optional<int>& v) { return v.has_value() && *v != 0; };
  layer("nnodes", &Settings::nnodes, set, topology.nnodes);
  if (r.origin["nnodes"] != "flag" && r.origin["nnodes"] != config && topology.nnodes) r.settings.nnodes_min = topology.nnodes_min;
  // An elastic job in a Slurm step (srun --nodes 2-4 airhost --nnodes 2:4): no more nodes can
  // come than the step has, so its count is MAX, and the job starts as soon as they all joined.
  if (r.settings.nnodes_min && r.settings.nnodes && topology.source == "slurm" && topology.nnodes &&
      *topology.nnodes < *r.settings.nnodes) {
    const std::string range = std::to_string(*r.settings.nnodes_min) + ":" + std::to_string(*r.settings.nnodes);
    if (*topology.nnodes < *r.settings.nnodes_min)
      throw ConfigError("--nnodes " + range + " needs at least " + std::to_string(*r.settings.nnodes_min) +
                        " nodes, but this Slurm step has " + std::to_string(*topology.nnodes) + " (" +
                        topology.why.at("nnodes") + "): ask srun for them (srun --nodes " + range.substr(0, range.find(':')) +
                        "-" + std::to_string(*r.settings.nnodes) + ")");
    r.settings.nnodes = *topology.nnodes;
    r.origin["nnodes"] += "; MAX " + std::to_string(*topology.nnodes) + " from " + topology.source + ": " +
                          topology.why.at("nnodes");
  }
  layer("node_rank", &Settings::node_rank, set, topology.node_rank);
  layer("master_addr", &Settings::master_addr, set, topology.master_addr);
  layer("master_port", &Settings::master_port, set_nonzero, topology.master_port);
  layer("accelerators", &Settings::accelerators, set_nonzero, topology.accelerators);
  return r;
}

}  // namespace airhost::detail
