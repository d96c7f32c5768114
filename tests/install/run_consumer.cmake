# Installs the already-built mixprec into WORK_DIR/prefix, then configures, builds and runs
# a small outside project that uses find_package(mixprec) and links mixprec::mixprec and mixprec::report; then moves the
# prefix and runs the installed CLI from there (it must load the libmixprec installed beside it, and the
# oneDNN the build used).
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK_DIR}/build
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer project failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer project failed (${rc})")
endif()
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "consumer printed: ${out}")
if(NOT rc EQUAL 0 OR NOT out MATCHES "consumer ok")
  message(FATAL_ERROR "the consumer program failed (${rc}): ${out}")
endif()

# The installed CLI (when the build has one) from a moved prefix: its RUNPATH names $ORIGIN/../lib, not
# the build tree, so it runs with the library installed beside it.
if(EXISTS ${WORK_DIR}/prefix/bin/mixprec)
  file(RENAME ${WORK_DIR}/prefix ${WORK_DIR}/moved)
  execute_process(COMMAND ${WORK_DIR}/moved/bin/mixprec info RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "mixprec")
    message(FATAL_ERROR "the installed CLI did not run from a moved prefix (${rc}): ${out}${err}")
  endif()
  find_program(LDD ldd)
  if(LDD)
    execute_process(COMMAND ${LDD} ${WORK_DIR}/moved/bin/mixprec OUTPUT_VARIABLE deps)
    string(REGEX MATCH "libmixprec\\.so[^\n]*" line "${deps}")
    string(FIND "${line}" "${WORK_DIR}/moved/" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the installed CLI loads libmixprec from outside its prefix: ${line}")
    endif()
    message(STATUS "installed CLI: ${line}")
    string(REGEX MATCH "libmixprec_report[^\n]*" line "${deps}")
    string(FIND "${line}" "${WORK_DIR}/moved/" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "the installed CLI loads libmixprec_report from outside its prefix: '${line}'")
    endif()
    message(STATUS "installed CLI: ${line}")
    # oneDNN is not installed with mixprec: the installed libmixprec finds it where the build found it
    # (scripts/setup.sh's .deps/onednn) through its RUNPATH.
    string(REGEX MATCH "libdnnl[^\n]*" dnnl "${deps}")
    if(NOT dnnl OR dnnl MATCHES "not found")
      message(FATAL_ERROR "the installed CLI does not find oneDNN (ldd: '${dnnl}'); the installed libmixprec's "
                          "RUNPATH should name the folder of the libdnnl.so.3 it was built against:\n${deps}")
    endif()
    message(STATUS "installed CLI: ${dnnl}")
  endif()
endif()
