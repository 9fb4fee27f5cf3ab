// libFuzzer harness: the input is a program of public API calls (api_program.h says how it is
// read and what is checked). Only <te/te.h> and libte.so.
#include <cstddef>
#include <cstdint>

#include "api_program.h"

FUZZ_SANITIZER_DEFAULTS

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz::Reader reader(data, size);
  fuzz::Program program(reader);
  program.run();
  return 0;
}
