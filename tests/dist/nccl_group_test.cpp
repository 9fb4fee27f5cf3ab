// Two ranks, one process and one GPU each, one NCCL group: each rank feeds different data to two
// FP8 linears inside one autocast scope, twice. Checks that
//  - every rank's scaling states hold the global max amax (not the local one) in their history,
//  - scales, scale_invs and histories are bit-identical across ranks (exchanged through files),
//  - one amax all-reduce per bucket and pass, whatever the number of layers.
// Public API only (te/te.h). Exits 77 (SKIP) with fewer than 2 usable GPUs or without NCCL.
#include <te/te.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "multi_rank.h"

namespace {

using multi_rank::g_failures;
using multi_rank::g_rank;
using multi_rank::share_bytes;
using multi_rank::wait_child;

constexpr int kRanks = 2;
constexpr int kTokens = 32, kIn = 64, kHidden = 32, kOut = 32;
constexpr int kPasses = 2;
constexpr size_t kHistCap = 1024;  // the default amax_history_len: the whole history

te_tensor make_tensor(void *data, int64_t rows, int64_t cols) {
  te_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = TE_DTYPE_F32;
  t.ndim = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.device.type = TE_DEVICE_CUDA;
  t.device.index = 0;
  return t;
}

// Deterministic values in [-bound, bound), different per rank and per pass (seed).
std::vector<float> make_data(size_t n, float bound, unsigned seed) {
  std::vector<float> v(n);
  unsigned s = seed * 2654435761u + 12345u;
  for (auto &x : v) {
    s = s * 1664525u + 1013904223u;
    x = bound * (static_cast<float>(s >> 8) / 8388608.0f - 1.0f) * 0.5f;
  }
  return v;
}

struct StateDump {
  float scale, scale_inv;
  int32_t history_len;
  float history[kHistCap];
};

int run_rank(int rank, const std::string &dir) {
  g_rank = rank;
  te_nccl_id id;
  if (rank == 0) CHECK_TE(te_nccl_get_unique_id(&id));
  share_bytes(dir, "id", &id, sizeof id);

  // CUDA_VISIBLE_DEVICES (set by the parent) leaves this rank's GPU as device 0, the current
  // device on which te_group_init_nccl makes the communicator.
  te_context_options copts;
  CHECK_TE(te_context_options_init(&copts));
  copts.use_default_device = 0;
  copts.device.type = TE_DEVICE_CUDA;
  copts.device.index = 0;
  te_context *ctx = nullptr;
  CHECK_TE(te_context_create(&ctx, &copts));
  te_group *group = nullptr;
  CHECK_TE(te_group_init_nccl(&group, rank, kRanks, &id));
  EXPECT(te_group_rank(group) == rank, "rank %d", te_group_rank(group));
  EXPECT(te_group_size(group) == kRanks, "size %d", te_group_size(group));

  te_linear_options lopts;
  CHECK_TE(te_linear_options_init(&lopts));
  lopts.bias = 0;
  lopts.activation_dtype = TE_DTYPE_F32;
  te_linear *lin[2] = {nullptr, nullptr};
  lopts.in_features = kIn;
  lopts.out_features = kHidden;
  CHECK_TE(te_linear_create(&lin[0], ctx, &lopts));
  lopts.in_features = kHidden;
  lopts.out_features = kOut;
  CHECK_TE(te_linear_create(&lin[1], ctx, &lopts));

  void *dx, *dw1, *dw2, *dy1, *dy2;
  CHECK_TE(te_context_malloc(ctx, sizeof(float) * kTokens * kIn, &dx));
  CHECK_TE(te_context_malloc(ctx, sizeof(float) * kHidden * kIn, &dw1));
  CHECK_TE(te_context_malloc(ctx, sizeof(float) * kOut * kHidden, &dw2));
  CHECK_TE(te_context_malloc(ctx, sizeof(float) * kTokens * kHidden, &dy1));
  CHECK_TE(te_context_malloc(ctx, sizeof(float) * kTokens * kOut, &dy2));

  // Planted maxima: rank 1's input and weight amaxes are the global ones in every pass.
  float global_x_max[kPasses], global_w_max[kPasses];
  for (int pass = 0; pass < kPasses; ++pass) {
    std::vector<float> x = make_data(size_t(kTokens) * kIn, 2.0f, 100 * pass + rank);
    std::vector<float> w1 = make_data(size_t(kHidden) * kIn, 0.5f, 100 * pass + 10 + rank);
    std::vector<float> w2 = make_data(size_t(kOut) * kHidden, 0.5f, 100 * pass + 20 + rank);
    float local_x = 1.5f + pass, local_w = 0.625f + 0.125f * pass;
    global_x_max[pass] = 4.75f + pass;           // rank 1's
    global_w_max[pass] = 0.875f + 0.125f * pass;  // rank 1's
    if (rank == 1) local_x = global_x_max[pass], local_w = global_w_max[pass];
    x[size_t(rank) * 7 + 3] = -local_x;
    w1[size_t(rank) * 5 + 1] = local_w;
    CHECK_TE(te_context_copy(ctx, dx, x.data(), sizeof(float) * x.size(), TE_COPY_HOST_TO_DEVICE));
    CHECK_TE(te_context_copy(ctx, dw1, w1.data(), sizeof(float) * w1.size(), TE_COPY_HOST_TO_DEVICE));
    CHECK_TE(te_context_copy(ctx, dw2, w2.data(), sizeof(float) * w2.size(), TE_COPY_HOST_TO_DEVICE));

    te_autocast_options aopts;
    CHECK_TE(te_autocast_options_init(&aopts));
    aopts.enabled = 1;
    aopts.group = group;
    te_autocast_token token;
    CHECK_TE(te_autocast_begin(ctx, &aopts, &token));
    te_tensor tx = make_tensor(dx, kTokens, kIn), tw1 = make_tensor(dw1, kHidden, kIn),
              ty1 = make_tensor(dy1, kTokens, kHidden), tw2 = make_tensor(dw2, kOut, kHidden),
              ty2 = make_tensor(dy2, kTokens, kOut);
    te_linear_forward_args fa;
    CHECK_TE(te_linear_forward_args_init(&fa));
    fa.input = &tx;
    fa.weight = &tw1;
    te_linear_backward_ctx *b1 = nullptr, *b2 = nullptr;
    CHECK_TE(te_linear_forward(ctx, lin[0], &fa, &ty1, &b1));
    fa.input = &ty1;
    fa.weight = &tw2;
    CHECK_TE(te_linear_forward(ctx, lin[1], &fa, &ty2, &b2));
    CHECK_TE(te_autocast_end(ctx, token));
    CHECK_TE(te_context_synchronize(ctx));
    te_linear_backward_ctx_destroy(b1);
    te_linear_backward_ctx_destroy(b2);

    te_context_stats st;
    st.struct_size = sizeof st;
    CHECK_TE(te_context_get_stats(ctx, &st));
    // Two layers, four forward scaling states, one bucket: one reduction per pass.
    EXPECT(st.amax_reductions == uint64_t(pass + 1), "pass %d: amax_reductions %llu", pass,
           (unsigned long long)st.amax_reductions);
    EXPECT(st.bucket_updates == uint64_t(pass + 1), "pass %d: bucket_updates %llu", pass,
           (unsigned long long)st.bucket_updates);
    EXPECT(st.states_updated == uint64_t(4 * (pass + 1)), "pass %d: states_updated %llu", pass,
           (unsigned long long)st.states_updated);
  }

  // Dump the four forward states; check the history holds the global maxima.
  std::vector<StateDump> dumps;
  for (int l = 0; l < 2; ++l)
    for (te_tensor_role role : {TE_ROLE_INPUT, TE_ROLE_WEIGHT}) {
      StateDump d;
      std::memset(&d, 0, sizeof d);
      te_scaling_state_info info;
      info.struct_size = sizeof info;
      CHECK_TE(te_linear_get_scaling_state(ctx, lin[l], role, &info, d.history, kHistCap));
      d.scale = info.scale;
      d.scale_inv = info.scale_inv;
      d.history_len = info.amax_history_len;
      dumps.push_back(d);
      if (l == 0) {
        const float *want = role == TE_ROLE_INPUT ? global_x_max : global_w_max;
        size_t n = std::min<size_t>(kHistCap, size_t(d.history_len));
        for (int pass = 0; pass < kPasses; ++pass) {
          bool found = false;
          for (size_t i = 0; i < n; ++i) found |= d.history[i] == want[pass];
          EXPECT(found, "layer 0 %s: global amax %g of pass %d not in the history", role == TE_ROLE_INPUT ? "input" : "weight",
                 want[pass], pass);
        }
        std::string nz;
        for (size_t i = 0; i < n; ++i)
          if (d.history[i] != 0.0f) nz += " [" + std::to_string(i) + "]=" + std::to_string(d.history[i]);
        std::printf("[rank %d] layer 0 %s: scale %.9g scale_inv %.9g history (len %d) non-zero:%s\n", rank,
                    role == TE_ROLE_INPUT ? "input " : "weight", d.scale, d.scale_inv, d.history_len, nz.c_str());
      }
    }
  std::string out = dir + "/rank" + std::to_string(rank) + ".bin";
  FILE *f = std::fopen(out.c_str(), "wb");
  if (!f || std::fwrite(dumps.data(), sizeof(StateDump), dumps.size(), f) != dumps.size()) return 1;
  std::fclose(f);

  for (void *p : {dx, dw1, dw2, dy1, dy2}) te_context_free(ctx, p);
  te_linear_destroy(lin[0]);
  te_linear_destroy(lin[1]);
  te_context_destroy(ctx);
  te_group_destroy(group);
  std::fflush(stdout);
  return g_failures ? 1 : 0;
}

}  // namespace

int main() {
  // NVLink multicast stays off (it can take a shared host's GPUs out of service).
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  std::fflush(stdout);

  // Probe in a child (no CUDA in the parent, which forks): is there a second usable GPU?
  pid_t probe = fork();
  if (probe == 0) {
    te_context_options o;
    te_context_options_init(&o);
    o.use_default_device = 0;
    o.device.type = TE_DEVICE_CUDA;
    o.device.index = kRanks - 1;
    te_context *c = nullptr;
    std::_Exit(te_context_create(&c, &o) == TE_SUCCESS ? 0 : 77);
  }
  if (wait_child(probe) != 0) {
    std::printf("SKIP: fewer than %d usable GPUs\n", kRanks);
    return 77;
  }

  char tmpl[] = "/tmp/te_nccl_XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  std::string dir = tmpl;
  pid_t pids[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      setenv("CUDA_VISIBLE_DEVICES", std::to_string(r).c_str(), 1);
      alarm(120);  // a hung collective fails the test instead of the CI job
      std::_Exit(run_rank(r, dir));
    }
  }
  int rc[kRanks], worst = 0;
  for (int r = 0; r < kRanks; ++r) {
    rc[r] = wait_child(pids[r]);
    std::printf("rank %d exited with %d\n", r, rc[r]);
    if (rc[r] != 0 && worst != 1) worst = rc[r] == 77 ? 77 : 1;
  }
  if (worst == 77) {
    std::printf("SKIP: NCCL groups unsupported here\n");
    return 77;
  }
  if (worst) {
    std::printf("FAIL\n");
    return 1;
  }

  // Bit-identical FP8 state across ranks.
  std::vector<StateDump> d[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    d[r].resize(4);
    FILE *f = std::fopen((dir + "/rank" + std::to_string(r) + ".bin").c_str(), "rb");
    if (!f || std::fread(d[r].data(), sizeof(StateDump), 4, f) != 4) {
      std::printf("FAIL: no state dump from rank %d\n", r);
      return 1;
    }
    std::fclose(f);
  }
  int failures = 0;
  const char *names[4] = {"layer0.input", "layer0.weight", "layer1.input", "layer1.weight"};
  for (int i = 0; i < 4; ++i)
    for (int r = 1; r < kRanks; ++r)
      if (std::memcmp(&d[0][i], &d[r][i], sizeof(StateDump)) != 0) {
        std::printf("FAIL: %s differs between rank 0 (scale %.9g) and rank %d (scale %.9g)\n", names[i],
                    d[0][i].scale, r, d[r][i].scale);
        ++failures;
      }
  for (int r = 0; r < kRanks; ++r) std::remove((dir + "/rank" + std::to_string(r) + ".bin").c_str());
  std::remove((dir + "/id").c_str());
  rmdir(dir.c_str());
  if (failures) return 1;
  std::printf("PASS: %d ranks, global amaxes in every history, bit-identical scales, 1 all-reduce per pass\n", kRanks);
  return 0;
}
