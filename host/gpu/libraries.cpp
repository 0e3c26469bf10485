// libraries.cpp — finding and opening the CUDA runtime, NCCL and cuBLAS (libraries.hpp).
#include "gpu/libraries.hpp"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/built_for.hpp"
#include "base/util.hpp"

namespace airhost::detail {

namespace {

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// The file a dlopen handle maps.
std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) {
    return map->l_name;
  }
  return fallback;
}

// Files in `dir` named <stem>.so* or <stem>-<hash>.so* (torch/lib bundles libraries so).
std::vector<std::string> bundled(const std::string& dir, const std::string& stem) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(stem, 0) == 0 && name.size() > stem.size() && (name[stem.size()] == '.' || name[stem.size()] == '-') &&
        name.find(".so") != std::string::npos) {
      found.push_back(entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

const LibrarySpec& cuda_runtime_library() {
  static const LibrarySpec spec{"the CUDA runtime (libcudart)", "AIRHOST_CUDART_LIBRARY",
                                {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"},
                                {"cuda_runtime", "cu13"}, "libcudart",
                                "install it (pip install nvidia-cuda-runtime-cu12, which torch's CUDA "
                                "wheels bring, or the CUDA toolkit)"};
  return spec;
}

const LibrarySpec& nccl_library() {
  static const LibrarySpec spec{"NCCL (libnccl)", "AIRHOST_NCCL_LIBRARY", {"libnccl.so.2", "libnccl.so"},
                                {"nccl"}, "libnccl",
                                "install it (pip install nvidia-nccl-cu12, which torch's CUDA wheels "
                                "bring, or the libnccl2 package)"};
  return spec;
}

const LibrarySpec& cublas_library() {
  static const LibrarySpec spec{"cuBLAS (libcublas)", "AIRHOST_CUBLAS_LIBRARY",
                                {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"},
                                {"cublas", "cu13"}, "libcublas",
                                "install it (pip install nvidia-cublas-cu12, which torch's CUDA wheels "
                                "bring, or the CUDA toolkit)"};
  return spec;
}

std::vector<std::string> library_candidates(const LibrarySpec& spec,
                                            const std::vector<std::string>& site_packages) {
  const auto& names = spec.names;
  std::vector<std::string> candidates = names;
  for (const auto& n : names) candidates.push_back("/usr/local/cuda/lib64/" + n);
  if (const char* conda = std::getenv("CONDA_PREFIX"); conda && *conda) {
    for (const auto& n : names) candidates.push_back(std::string(conda) + "/lib/" + n);
  }
  for (const auto& sp : site_packages) {
    for (const auto& dir : spec.wheel_dirs) {
      for (const auto& n : names) candidates.push_back(sp + "/nvidia/" + dir + "/lib/" + n);
    }
    for (const auto& b : bundled(sp + "/torch/lib", spec.stem)) candidates.push_back(b);
  }
  return candidates;
}

OpenedLibrary open_library(const LibrarySpec& spec) { return open_library(spec, site_packages_dirs()); }

OpenedLibrary open_library(const LibrarySpec& spec, const std::vector<std::string>& site_packages) {
  OpenedLibrary lib;
  const std::string& what = spec.what;
  const std::string& env_var = spec.env_var;
  const char* from_env = std::getenv(env_var.c_str());
  if (from_env && *from_env) {
    lib.handle = dlopen(from_env, RTLD_NOW | RTLD_LOCAL);
    if (!lib.handle) {
      const char* why = dlerror();
      lib.status.error = what + " could not be loaded: " + env_var + "=" + from_env +
                         ": " + (why ? why : "unknown dlopen error");
      return lib;
    }
    lib.status.loaded = true;
    lib.status.path = loaded_path(lib.handle, from_env);
    return lib;
  }

  const std::vector<std::string> candidates = library_candidates(spec, site_packages);
  std::vector<std::string> broken;  // found, but would not load (a missing dependency, say)
  for (const auto& c : candidates) {
    if (c.find('/') != std::string::npos && !exists(c)) continue;
    lib.handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) {
      lib.status.loaded = true;
      lib.status.path = loaded_path(lib.handle, c);
      return lib;
    }
    const char* why = dlerror();
    std::string reason = why ? why : "unknown dlopen error";
    if (reason.find("No such file") == std::string::npos) broken.push_back(reason);
  }
  std::string tried;
  for (const auto& n : spec.names) tried += (tried.empty() ? "" : ", ") + n;
  lib.status.error = what + " not found (tried " + tried +
                     " on the library path, in /usr/local/cuda/lib64 and in the Python "
                     "environment's nvidia/ wheels and torch/lib)";
  if (!broken.empty()) lib.status.error += "; found but not loadable: " + broken.front();
  lib.status.error += "; " + spec.install_hint + ", or set " + env_var + " to its path";
  return lib;
}

// site-packages of the Python environment airhost belongs to: pip puts NVIDIA's wheels
// (nvidia-nccl-cu12, the CUDA runtime and cuBLAS torch depends on) under nvidia/*/lib there.
std::vector<std::string> site_packages_dirs() {
  std::vector<std::string> prefixes;
  const std::string exe = executable_path();
  if (!exe.empty()) prefixes.push_back(dirname_of(dirname_of(exe)));
#ifdef AIRHOST_DEFAULT_PYTHON
  prefixes.push_back(dirname_of(dirname_of(AIRHOST_DEFAULT_PYTHON)));
#endif
  std::vector<std::string> dirs;
  for (const auto& prefix : prefixes) {
    for (const char* kind : {"site-packages", "dist-packages"}) {
      std::string dir = prefix + "/lib/python" + built_python_version() + "/" + kind;
      if (exists(dir) && std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
    }
  }
  // An environment layered over another (a venv whose .pth names the site-packages of the
  // Python that holds torch, as scripts/gpu-check.sh makes on a node without a registry)
  // finds NVIDIA's wheels there too, as the ranks' interpreter does.
  const size_t own = dirs.size();
  for (size_t i = 0; i < own; ++i) {
    for (const auto& extra : pth_site_dirs(dirs[i])) {
      if (std::find(dirs.begin(), dirs.end(), extra) == dirs.end()) dirs.push_back(extra);
    }
  }
  return dirs;
}

std::vector<std::string> pth_site_dirs(const std::string& site_dir) {
  std::vector<std::string> found;
  std::error_code ec;
  std::vector<std::filesystem::path> pth_files;
  for (const auto& entry : std::filesystem::directory_iterator(site_dir, ec)) {
    if (entry.path().extension() == ".pth") pth_files.push_back(entry.path());
  }
  std::sort(pth_files.begin(), pth_files.end());  // site.py reads them in name order
  for (const auto& file : pth_files) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      // site.py: '#' lines are comments, "import" lines are code; any other line is a
      // directory to add, relative to the .pth file's own directory when not absolute.
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t' ||
                                 (line.back() == '/' && line.size() > 1))) {
        line.pop_back();
      }
      if (line.empty() || line[0] == '#' || line.rfind("import ", 0) == 0 || line.rfind("import\t", 0) == 0) continue;
      std::filesystem::path dir(line);
      if (dir.is_relative()) dir = std::filesystem::path(site_dir) / dir;
      const std::string name = dir.lexically_normal().filename().string();
      if ((name == "site-packages" || name == "dist-packages") && std::filesystem::is_directory(dir, ec)) {
        found.push_back(dir.lexically_normal().string());
      }
    }
  }
  return found;
}

std::string cuda_version_string(int version) {
  if (version <= 0) return "";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

std::string library_version(int code) {
  if (code <= 0) return "";
  const int major_unit = code >= 10000 ? 10000 : 1000;  // NCCL 2.9 on: 22105; before: 2708
  return std::to_string(code / major_unit) + "." + std::to_string((code % major_unit) / 100) + "." +
         std::to_string(code % 100);
}

}  // namespace airhost::detail
