// abi_compat.hpp — when two declarations of one C function agree on its ABI.
//
// tests/abi/check_gpu_abi.cpp holds host/gpu/nvidia_api.hpp against NVIDIA's headers with it, and
// the fakes in tests/fake_cuda and tests/fake_nvml hold their definitions against
// nvidia_api.hpp, so the fakes the tests load and NVIDIA's libraries take the same calls.
#pragma once

#include <cstddef>
#include <type_traits>

namespace airhost::test {

template <typename T>
constexpr bool int_like = std::is_integral_v<T> || std::is_enum_v<T>;

template <typename T, typename = void>
struct is_complete : std::false_type {};
template <typename T>
struct is_complete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

// Integers or enums of one size: an enum parameter written as an int; two plain integers
// must also agree on signedness.
template <typename A, typename B>
constexpr bool same_int_abi() {
  return sizeof(A) == sizeof(B) && (std::is_enum_v<A> || std::is_enum_v<B> || std::is_signed_v<A> == std::is_signed_v<B>);
}

// What a pointer points to: the same type; integers/enums of one size; two structs, when
// both are incomplete (opaque handles) or of one size (their fields are checked apart);
// void and an incomplete struct (a handle a fake keeps as void*); or pointers that agree,
// one level down.
template <typename A, typename B>
constexpr bool same_pointee_abi() {
  if constexpr (std::is_const_v<A> != std::is_const_v<B>) {
    return false;
  } else {
    using a = std::remove_cv_t<A>;
    using b = std::remove_cv_t<B>;
    if constexpr (std::is_same_v<a, b>) {
      return true;
    } else if constexpr (int_like<a> && int_like<b>) {
      return same_int_abi<a, b>();
    } else if constexpr (std::is_class_v<a> && std::is_class_v<b>) {
      if constexpr (is_complete<a>::value && is_complete<b>::value) {
        return sizeof(a) == sizeof(b) && alignof(a) == alignof(b);
      } else {
        return !is_complete<a>::value && !is_complete<b>::value;
      }
    } else if constexpr (std::is_void_v<a> && std::is_class_v<b>) {
      return !is_complete<b>::value;
    } else if constexpr (std::is_class_v<a> && std::is_void_v<b>) {
      return !is_complete<a>::value;
    } else if constexpr (std::is_pointer_v<a> && std::is_pointer_v<b>) {
      return same_pointee_abi<std::remove_pointer_t<a>, std::remove_pointer_t<b>>();
    } else {
      return false;
    }
  }
}

// Passed by value: the same type, integers/enums that agree, or pointers that agree, as
// for what a pointer points to (no call here passes a struct by value).
template <typename A, typename B>
constexpr bool same_value_abi() {
  using a = std::remove_cv_t<A>;
  using b = std::remove_cv_t<B>;
  if constexpr (!std::is_same_v<a, b> && (std::is_class_v<a> || std::is_class_v<b>)) {
    return false;
  } else {
    return same_pointee_abi<a, b>();
  }
}

template <typename Ours, typename Theirs>
struct same_function_abi : std::false_type {};
template <typename R1, typename... A1, typename R2, typename... A2>
struct same_function_abi<R1 (*)(A1...), R2 (*)(A2...)> {
  static constexpr bool value = [] {
    if constexpr (sizeof...(A1) != sizeof...(A2)) {
      return false;
    } else {
      return (std::is_void_v<R1> == std::is_void_v<R2>)&&(std::is_void_v<R1> || same_value_abi<R1, R2>()) &&
             (same_value_abi<A1, A2>() && ...);
    }
  }();
};
template <typename R1, typename... A1, typename R2, typename... A2>
struct same_function_abi<R1 (*)(A1...), R2 (*)(A2...) noexcept> : same_function_abi<R1 (*)(A1...), R2 (*)(A2...)> {};

// The checker itself must tell drift apart, or it proves nothing.
using int_fn = int (*)(int*);
static_assert(same_function_abi<int_fn, int (*)(int*)>::value);
static_assert(!same_function_abi<int_fn, int (*)(long*)>::value);
static_assert(!same_function_abi<int_fn, int (*)(unsigned*)>::value);
static_assert(!same_function_abi<int_fn, int (*)(int*, int)>::value);
static_assert(!same_function_abi<int_fn, int (*)(const int*)>::value);
static_assert(!same_function_abi<int (*)(std::size_t), int (*)(unsigned)>::value);
namespace self_test {
struct handle_st;
struct three_words {
  unsigned long long a, b, c;
};
struct two_words {
  unsigned long long a, b;
};
static_assert(same_function_abi<int (*)(handle_st*), int (*)(void*)>::value);
static_assert(!same_function_abi<int (*)(handle_st*), int (*)(handle_st**)>::value);
static_assert(!same_function_abi<int (*)(three_words*), int (*)(two_words*)>::value);
static_assert(!same_function_abi<int (*)(three_words*), int (*)(void*)>::value);
static_assert(!same_function_abi<const char* (*)(int), char* (*)(int)>::value);
static_assert(!same_function_abi<int (*)(three_words), int (*)(three_words*)>::value);
}  // namespace self_test

}  // namespace airhost::test

// NAME, defined or declared in this translation unit, takes the calls nvidia_api.hpp's pointer
// type for NAME makes.
#define AIRHOST_CHECK_AGAINST_GPU_ABI(name)                                                                \
  static_assert(::airhost::test::same_function_abi<::airhost::detail::nvidia::fn::name, decltype(&::name)>::value, \
                #name " here differs from its declaration in host/gpu/nvidia_api.hpp")
