// Finding and opening NVIDIA's libraries (host/gpu/libraries.hpp) and resolving their entry
// points (host/gpu/nvidia_api.hpp), with NVIDIA's real CUDA runtime from the wheels that
// scripts/fetch-gpu-sdk.py unpacks into AIRHOST_GPU_SDK (build/gpu-sdk), laid out in a
// scratch directory as pip and torch lay it out. No GPU is needed: nothing here calls one.
#include <doctest/doctest.h>

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/libraries.hpp"
#include "gpu/nvidia_api.hpp"
#include "support.hpp"

using namespace airhost::detail;
using airhost_test::ScopedEnv;
using airhost_test::TempDir;

namespace {

// A library of our own name, so that no copy on this machine's loader path is found first.
LibrarySpec test_spec() {
  return LibrarySpec{"the test's CUDA runtime", "AIRHOST_TEST_CUDART_LIBRARY", {"libairhost-test-cudart.so.13"},
                     {"cuda_runtime", "cu13"}, "libairhost-test-cudart", "install it (it is a test)"};
}

std::ptrdiff_t position(const std::vector<std::string>& v, const std::string& s) {
  auto it = std::find(v.begin(), v.end(), s);
  return it == v.end() ? -1 : it - v.begin();
}

}  // namespace

TEST_CASE("library candidates: sonames, /usr/local/cuda, $CONDA_PREFIX, then NVIDIA's wheels and torch/lib") {
  TempDir sp;
  sp.write("torch/lib/libairhost-test-cudart-3f2a1b.so.13", "");
  sp.write("torch/lib/libairhost-test-cudart_other.so", "");  // another library's name
  ScopedEnv env;
  env.set("CONDA_PREFIX", "/opt/conda");
  const auto c = library_candidates(test_spec(), {sp.path()});
  REQUIRE(c.size() == 6);
  CHECK(c[0] == "libairhost-test-cudart.so.13");
  CHECK(c[1] == "/usr/local/cuda/lib64/libairhost-test-cudart.so.13");
  CHECK(c[2] == "/opt/conda/lib/libairhost-test-cudart.so.13");
  CHECK(c[3] == sp.path() + "/nvidia/cuda_runtime/lib/libairhost-test-cudart.so.13");
  CHECK(c[4] == sp.path() + "/nvidia/cu13/lib/libairhost-test-cudart.so.13");
  CHECK(c[5] == sp.path() + "/torch/lib/libairhost-test-cudart-3f2a1b.so.13");
  env.set("CONDA_PREFIX", std::nullopt);
  CHECK(position(library_candidates(test_spec(), {}), "/opt/conda/lib/libairhost-test-cudart.so.13") == -1);
}

TEST_CASE("the specs of the CUDA runtime, NCCL and cuBLAS name their overrides and wheels") {
  CHECK(cuda_runtime_library().env_var == "AIRHOST_CUDART_LIBRARY");
  CHECK(nccl_library().env_var == "AIRHOST_NCCL_LIBRARY");
  CHECK(cublas_library().env_var == "AIRHOST_CUBLAS_LIBRARY");
  const auto nccl = library_candidates(nccl_library(), {"/sp"});
  CHECK(position(nccl, "/sp/nvidia/nccl/lib/libnccl.so.2") > position(nccl, "libnccl.so.2"));
}

TEST_CASE("a library found nowhere is an error naming what was tried, how to get it and the override") {
  ScopedEnv env;
  env.set("AIRHOST_TEST_CUDART_LIBRARY", std::nullopt).set("CONDA_PREFIX", std::nullopt);
  TempDir sp;
  const OpenedLibrary lib = open_library(test_spec(), {sp.path()});
  CHECK(lib.handle == nullptr);
  CHECK_FALSE(lib.status.loaded);
  CHECK(lib.status.error ==
        "the test's CUDA runtime not found (tried libairhost-test-cudart.so.13 on the library path, in "
        "/usr/local/cuda/lib64 and in the Python environment's nvidia/ wheels and torch/lib); install it (it is a "
        "test), or set AIRHOST_TEST_CUDART_LIBRARY to its path");
  // A file of that name that is no library is named as found but not loadable.
  sp.write("nvidia/cu13/lib/libairhost-test-cudart.so.13", "not an ELF file");
  const OpenedLibrary broken = open_library(test_spec(), {sp.path()});
  CHECK(broken.handle == nullptr);
  CHECK(broken.status.error.find("; found but not loadable: ") != std::string::npos);
}

TEST_CASE("an override that does not load says so, naming the variable and the file") {
  ScopedEnv env;
  env.set("AIRHOST_TEST_CUDART_LIBRARY", "/nonexistent/libcudart.so.13");
  const OpenedLibrary lib = open_library(test_spec(), {});
  CHECK(lib.handle == nullptr);
  CHECK(lib.status.error.rfind("the test's CUDA runtime could not be loaded: "
                               "AIRHOST_TEST_CUDART_LIBRARY=/nonexistent/libcudart.so.13: ", 0) == 0);
}

TEST_CASE("versions read as NVIDIA prints them") {
  CHECK(cuda_version_string(12040) == "12.4");
  CHECK(cuda_version_string(13000) == "13.0");
  CHECK(cuda_version_string(0) == "");
  CHECK(library_version(22105) == "2.21.5");
  CHECK(library_version(2708) == "2.7.8");
  CHECK(library_version(120402) == "12.4.2");
  CHECK(library_version(-1) == "");
}

#if defined(AIRHOST_GPU_SDK_DIR) && defined(__x86_64__) && defined(__linux__)
// NVIDIA's libcudart, copied where pip and torch put it (a copy, not a link: the loader
// would otherwise hand back the copy another test loaded, under that one's path).
TEST_CASE("NVIDIA's real CUDA runtime is found in a wheel's nvidia/<dir>/lib and in torch/lib, and resolves") {
  ScopedEnv env;
  env.set("AIRHOST_TEST_CUDART_LIBRARY", std::nullopt).set("CONDA_PREFIX", std::nullopt);
  const std::string real = std::string(AIRHOST_GPU_SDK_DIR) + "/lib/libcudart.so.13";
  for (const std::string place : {"nvidia/cu13/lib/libairhost-test-cudart.so.13",
                                  "torch/lib/libairhost-test-cudart-5e8f0c1d.so.13"}) {
    CAPTURE(place);
    TempDir sp;
    const std::filesystem::path file = sp.path() + "/" + place;
    std::filesystem::create_directories(file.parent_path());
    std::filesystem::copy_file(real, file);
    const OpenedLibrary lib = open_library(test_spec(), {sp.path()});
    REQUIRE_MESSAGE(lib.handle != nullptr, lib.status.error);
    CHECK(lib.status.loaded);
    CHECK(lib.status.path == file.string());
    airhost::detail::nvidia::CudartApi api;
    CHECK(airhost::detail::nvidia::resolve(lib.handle, api) == nullptr);
    int version = 0;
    REQUIRE(static_cast<bool>(api.cudaRuntimeGetVersion));
    CHECK(api.cudaRuntimeGetVersion(&version) == 0);
    CHECK(version >= 13000);
    dlclose(lib.handle);
  }
}

TEST_CASE("a library that lacks required entry points is named by the first one missing") {
  // NCCL's library is no CUDA runtime: resolving the CUDA runtime's list in it fails at the
  // first required entry point, and an optional one missing is no failure.
  void* nccl = dlopen((std::string(AIRHOST_GPU_SDK_DIR) + "/lib/libnccl.so.2").c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE_MESSAGE(nccl != nullptr, dlerror());
  airhost::detail::nvidia::CudartApi cuda;
  CHECK(std::string(airhost::detail::nvidia::resolve(nccl, cuda)) == "cudaRuntimeGetVersion");
  airhost::detail::nvidia::NcclApi api;
  CHECK(airhost::detail::nvidia::resolve(nccl, api) == nullptr);
  CHECK(static_cast<bool>(api.ncclAllReduce));
}
#endif

TEST_CASE("a venv layered over another finds the other's site-packages through its .pth path lines") {
  TempDir own, node;
  node.write("lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2", "");
  node.write("lib/python3.12/dist-packages/x.py", "");
  const std::string node_site = node.path() + "/lib/python3.12/site-packages";
  own.write("b_layer.pth", "# the node's packages\n" + node_site + "\nimport site; site.addsitedir('" + node_site +
                               "')\n../../../elsewhere/site-packages\n");
  own.write("a_first.pth", node.path() + "/lib/python3.12/dist-packages/\r\n" + node.path() + "/lib/not-a-site\n");
  own.write("c_missing.pth", "/no/such/dir/site-packages\n");
  own.write("readme.txt", node_site + "\n");  // not a .pth: never read
  const auto dirs = pth_site_dirs(own.path());
  REQUIRE(dirs.size() == 2);
  CHECK(dirs[0] == node.path() + "/lib/python3.12/dist-packages");  // a_first.pth comes first
  CHECK(dirs[1] == node_site);
  CHECK(pth_site_dirs(own.path() + "/no-such-dir").empty());
  // And the layered site-packages is searched for NVIDIA's wheels like one's own.
  const auto c = library_candidates(nccl_library(), dirs);
  CHECK(position(c, node_site + "/nvidia/nccl/lib/libnccl.so.2") >= 0);
}
