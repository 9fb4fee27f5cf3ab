// Writes fuzz_checkpoint's seed corpus: real te_checkpoint_serialize output (what a file holds)
// of small checkpoints covering every record kind, storable dtype, shapes of 1..8 dimensions,
// names of 1 and 255 bytes, empty payloads and a module's state, plus two refused inputs (another
// format version, a truncation) so that the fuzzer starts on both sides of each check.
//   fuzz_make_checkpoint_corpus DIR
// scripts/test_fuzz.sh runs it on every run (seeds always match the library's format);
// tests/fuzz/corpus/fuzz_checkpoint/ holds a checked-in copy. Deterministic.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <te/te.h>

namespace {

std::string g_dir;
int g_written = 0;

void check(te_status s, const char *what) {
  if (s != TE_SUCCESS) {
    std::fprintf(stderr, "fuzz_make_checkpoint_corpus: %s failed: %s\n", what, te_last_error());
    std::exit(1);
  }
}

void write_file(const std::string &name, const std::vector<uint8_t> &bytes) {
  const std::string path = g_dir + "/seed-" + name;
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "fuzz_make_checkpoint_corpus: cannot write %s\n", path.c_str());
    std::exit(1);
  }
  ++g_written;
}

std::vector<uint8_t> serialized(const te_checkpoint *ck) {
  size_t n = 0;
  check(te_checkpoint_serialize(ck, nullptr, 0, &n), "te_checkpoint_serialize");
  std::vector<uint8_t> b(n);
  check(te_checkpoint_serialize(ck, b.data(), n, &n), "te_checkpoint_serialize");
  return b;
}

void put_tensor(te_context *ctx, te_checkpoint *ck, const char *name, te_dtype dtype, std::vector<int64_t> shape,
                uint32_t seed) {
  size_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<size_t>(d);
  const size_t esize = dtype == TE_DTYPE_F16 || dtype == TE_DTYPE_BF16 ? 2 : 4;
  std::vector<uint8_t> data(numel * esize);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 131 + seed * 17) >> 2);
  te_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data.data();
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  t.device.type = TE_DEVICE_CPU;
  check(te_checkpoint_put_tensor(ck, ctx, name, &t), "te_checkpoint_put_tensor");
}

te_checkpoint *fresh() {
  te_checkpoint *ck = nullptr;
  check(te_checkpoint_create(&ck), "te_checkpoint_create");
  return ck;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_checkpoint_corpus DIR\n");
    return 2;
  }
  g_dir = argv[1];
  mkdir(g_dir.c_str(), 0755);
  te_context_options o;
  te_context_options_init(&o);
  o.use_default_device = 0;
  o.device.type = TE_DEVICE_CPU;
  te_context *ctx = nullptr;
  check(te_context_create(&ctx, &o), "te_context_create");

  te_checkpoint *ck = fresh();
  write_file("empty", serialized(ck));
  te_checkpoint_destroy(ck);

  ck = fresh();
  check(te_checkpoint_put_bytes(ck, "step", "\x2a\0\0\0\0\0\0\0", 8), "te_checkpoint_put_bytes");
  check(te_checkpoint_put_bytes(ck, "e", nullptr, 0), "te_checkpoint_put_bytes");
  write_file("bytes", serialized(ck));
  te_checkpoint_destroy(ck);

  const te_dtype dtypes[] = {TE_DTYPE_F32, TE_DTYPE_F16, TE_DTYPE_BF16, TE_DTYPE_I32};
  const char *dnames[] = {"f32", "f16", "bf16", "i32"};
  for (int i = 0; i < 4; ++i) {
    ck = fresh();
    put_tensor(ctx, ck, "w", dtypes[i], {3, 2}, static_cast<uint32_t>(i));
    write_file(std::string("tensor-") + dnames[i], serialized(ck));
    te_checkpoint_destroy(ck);
  }

  ck = fresh();
  put_tensor(ctx, ck, "eight.dims", TE_DTYPE_BF16, {2, 1, 2, 1, 1, 2, 1, 3}, 7);
  put_tensor(ctx, ck, "v", TE_DTYPE_F32, {1}, 8);
  write_file("shapes", serialized(ck));
  te_checkpoint_destroy(ck);

  // A training checkpoint in small: a linear's weights, bias, AdamW moments, its state, the step.
  ck = fresh();
  te_linear_options lo;
  te_linear_options_init(&lo);
  lo.in_features = 16;
  lo.out_features = 16;
  lo.bias = 1;
  lo.activation_dtype = TE_DTYPE_BF16;
  te_linear *lin = nullptr;
  check(te_linear_create(&lin, ctx, &lo), "te_linear_create");
  size_t n = 0;
  check(te_linear_state_save(ctx, lin, nullptr, 0, &n), "te_linear_state_save");
  std::vector<uint8_t> state(n);
  check(te_linear_state_save(ctx, lin, state.data(), n, &n), "te_linear_state_save");
  te_linear_destroy(lin);
  put_tensor(ctx, ck, "layers.0.weight", TE_DTYPE_BF16, {16, 16}, 1);
  put_tensor(ctx, ck, "layers.0.bias", TE_DTYPE_BF16, {16}, 2);
  put_tensor(ctx, ck, "optim.layers.0.weight.m", TE_DTYPE_F32, {16, 16}, 3);
  put_tensor(ctx, ck, "optim.layers.0.weight.v", TE_DTYPE_F32, {16, 16}, 4);
  check(te_checkpoint_put_bytes(ck, "layers.0.state", state.data(), state.size()), "te_checkpoint_put_bytes");
  check(te_checkpoint_put_bytes(ck, "step", "\x07\0\0\0\0\0\0\0", 8), "te_checkpoint_put_bytes");
  write_file("training", serialized(ck));
  te_checkpoint_destroy(ck);

  ck = fresh();
  const std::string long_name(255, 'n');
  check(te_checkpoint_put_bytes(ck, long_name.c_str(), "x", 1), "te_checkpoint_put_bytes");
  check(te_checkpoint_put_bytes(ck, "a", "y", 1), "te_checkpoint_put_bytes");
  std::vector<uint8_t> b = serialized(ck);
  write_file("names", b);
  te_checkpoint_destroy(ck);

  // Refused inputs: another format version (the checksum recomputed would not matter: the version
  // is checked first), and a truncation.
  std::vector<uint8_t> v2 = b;
  v2[8] = 2;
  write_file("refused-version-2", v2);
  b.resize(b.size() - 5);
  write_file("refused-truncated", b);

  te_context_destroy(ctx);
  std::printf("fuzz_make_checkpoint_corpus: %d files\n", g_written);
  return 0;
}
