// libraries.hpp — finding and opening NVIDIA's user-space libraries (the CUDA runtime, NCCL,
// cuBLAS) at run time, wherever a node keeps them, and the version numbers they report.
// NVML, which comes with the driver and is opened by its soname alone, is nvml.hpp.
#pragma once

#include <string>
#include <vector>

namespace airhost::detail {

// One shared library airhost loaded, or failed to.
struct LibraryStatus {
  bool loaded = false;
  std::string path;     // the file loaded ("/usr/lib/x86_64-linux-gnu/libnccl.so.2")
  std::string version;  // "12.4", "2.21.5"
  std::string error;    // why not loaded, naming what was tried
};

// Where one library may be, and what to tell a user who has it nowhere.
struct LibrarySpec {
  std::string what;                     // "NCCL (libnccl)", for messages
  std::string env_var;                  // "AIRHOST_NCCL_LIBRARY": a path; only that file is tried
  std::vector<std::string> names;       // the sonames, preferred first
  std::vector<std::string> wheel_dirs;  // NVIDIA's wheels: <site-packages>/nvidia/<dir>/lib/<name>
  std::string stem;                     // torch/lib's bundled copies: <stem>.so* or <stem>-<hash>.so*
  std::string install_hint;             // "install it (pip install ...)"
};
const LibrarySpec& cuda_runtime_library();
const LibrarySpec& nccl_library();
const LibrarySpec& cublas_library();

// The files to try, in order: each name as a bare soname (the loader's search path), then
// under /usr/local/cuda/lib64, then $CONDA_PREFIX/lib, then for each of `site_packages`
// nvidia/<wheel_dir>/lib/<name> and torch/lib's <stem>*.so* files.
std::vector<std::string> library_candidates(const LibrarySpec& spec,
                                            const std::vector<std::string>& site_packages);

// A dlopen handle (never closed: the CUDA runtime and NCCL register exit handlers and threads
// that must not outlive their code), or null with status.error saying what was tried.
struct OpenedLibrary {
  void* handle = nullptr;
  LibraryStatus status;
};
// $<spec.env_var> when set (that file only), else the first of library_candidates that
// loads. The second form searches the given site-packages instead of site_packages_dirs().
OpenedLibrary open_library(const LibrarySpec& spec);
OpenedLibrary open_library(const LibrarySpec& spec, const std::vector<std::string>& site_packages);

// site-packages (and dist-packages) of the Python environment airhost belongs to: the one
// its binary is installed in, and the one it was built for.
std::vector<std::string> site_packages_dirs();

// The site-packages (or dist-packages) directories that the .pth files of `site_dir` add to
// sys.path by a path line, as site.py reads them: in file-name order, relative lines against
// `site_dir`, comments and `import` lines skipped, only directories that exist.
std::vector<std::string> pth_site_dirs(const std::string& site_dir);

// "12.4" from a CUDA version number as NVML and the CUDA runtime give it (12040); "" for 0.
std::string cuda_version_string(int version);
// "2.21.5" from NCCL's or cuBLAS's version number (22105; before NCCL 2.9, 2708 → 2.7.8).
std::string library_version(int code);

}  // namespace airhost::detail
