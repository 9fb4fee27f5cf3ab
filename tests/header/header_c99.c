/* The public header alone, compiled as strict C99 (-pedantic -Werror). */
#include <te/te.h>

int main(void) {
  te_tensor t = {0};
  te_recipe_options ro;
  (void)t;
  (void)ro;
  return TE_SUCCESS;
}
