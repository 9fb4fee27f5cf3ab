// The public header alone, compiled as C++ (-pedantic -Werror).
#include <te/te.h>

int main() {
  te_tensor t{};
  static_assert(sizeof(te_nccl_id) == 128, "te_nccl_id must match ncclUniqueId");
  (void)t;
  return TE_SUCCESS;
}
