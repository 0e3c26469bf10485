# airhost_check_embeddable_python(PYTHON ERROR_VAR): sets ERROR_VAR to one sentence when PYTHON
# cannot be embedded in a rank (else to ""), for the caller to stop on at the top level, where
# CMake prints the message without a call stack: no shared libpython (a Python configured without
# --enable-shared, as pyenv builds by default), or no headers (Debian's python3-dev missing).
# FindPython would otherwise fail with a trace that names neither the cause nor the fix, or,
# for a static libpython, link a rank in which no extension module (torch's included) loads.
function(airhost_check_embeddable_python python error_var)
  set(${error_var} "" PARENT_SCOPE)
  execute_process(
    COMMAND "${python}" -c [[
import os, sys, sysconfig
v = sysconfig.get_config_var
inc = sysconfig.get_paths()["include"]
lib = os.path.join(v("LIBDIR") or "", v("LDLIBRARY") or "")
print("%d.%d" % sys.version_info[:2], v("Py_ENABLE_SHARED") or 0, int(os.path.exists(os.path.join(inc, "Python.h"))), lib, inc, sep=";")
]]
    OUTPUT_VARIABLE probe OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    set(${error_var} "airhost: ${python} does not run (${err}): pass -DPython3_EXECUTABLE=/path/to/python3" PARENT_SCOPE)
    return()
  endif()
  list(GET probe 0 version)
  list(GET probe 1 shared)
  list(GET probe 2 headers)
  list(GET probe 3 library)
  list(GET probe 4 include)
  if(NOT shared)
    set(${error_var} "airhost: Python ${version} at ${python} has no shared libpython to embed (it was built without --enable-shared; found ${library}). Use a Python that has one (Debian/Ubuntu's python3 with python3-dev, conda, uv's Pythons, or pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared), then pass -DPython3_EXECUTABLE=/path/to/that/python3" PARENT_SCOPE)
    return()
  endif()
  if(NOT headers)
    set(${error_var} "airhost: Python ${version} at ${python} has no headers (${include}/Python.h is missing): install python${version}-dev (Debian/Ubuntu) or python3-devel (Fedora/RHEL)" PARENT_SCOPE)
    return()
  endif()
  message(STATUS "airhost: embedding Python ${version} from ${python} (${library})")
endfunction()
