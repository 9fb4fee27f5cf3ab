/*
 * gpt_checkpoint.c: gpt_save / gpt_load (te_checkpoint_*): the config's shape, the master
 * weights, both moments, the step count, every module's FP8 state and the caller's extra bytes.
 * See gpt_model.h.
 */
#include "gpt_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checkpoints ------------------------------------------------------------------------------ */

/* The shape a checkpoint must match: int64 fields in this machine's byte order (a byte record;
 * the checkpoint's own framing is little-endian). */
enum { SHAPE_FIELDS = 8 };
static void shape_record(const gpt_config *c, int64_t out[SHAPE_FIELDS]) {
  out[0] = c->vocab;
  out[1] = c->seq_len;
  out[2] = c->d_model;
  out[3] = c->n_layers;
  out[4] = c->n_heads;
  out[5] = c->d_ff;
  out[6] = c->act_dtype;
  out[7] = c->fp8;
}
static const char *const SHAPE_NAMES[SHAPE_FIELDS] = {"vocab",  "seq_len", "d_model",
                                                      "n_layers", "n_heads", "d_ff",
                                                      "act_dtype", "fp8"};

/* The modules whose FP8 state is saved, by name. */
typedef enum module_kind { MOD_QKV, MOD_ATTN, MOD_PROJ, MOD_MLP, MOD_HEAD } module_kind;
typedef struct module_ref {
  char name[MAX_NAME];
  module_kind kind;
  void *handle;
} module_ref;

static size_t list_modules(gpt *m, module_ref *out) {
  size_t n = 0;
  for (int l = 0; l < m->cfg.n_layers; ++l) {
    const char *names[4] = {"qkv", "attn", "proj", "mlp"};
    void *handles[4] = {m->blocks[l].qkv, m->blocks[l].attn, m->blocks[l].proj, m->blocks[l].mlp};
    for (int j = 0; j < 4; ++j) {
      snprintf(out[n].name, MAX_NAME, "fp8state.block%d.%s", l, names[j]);
      out[n].kind = (module_kind)j;
      out[n].handle = handles[j];
      ++n;
    }
  }
  snprintf(out[n].name, MAX_NAME, "fp8state.head");
  out[n].kind = MOD_HEAD;
  out[n].handle = m->head;
  return n + 1;
}

static te_status module_state_save(gpt *m, const module_ref *r, void *buf, size_t cap,
                                   size_t *size) {
  switch (r->kind) {
  case MOD_QKV: return te_layernorm_linear_state_save(m->ctx, r->handle, buf, cap, size);
  case MOD_ATTN: return te_attention_state_save(m->ctx, r->handle, buf, cap, size);
  case MOD_MLP: return te_layernorm_mlp_state_save(m->ctx, r->handle, buf, cap, size);
  default: return te_linear_state_save(m->ctx, r->handle, buf, cap, size);
  }
}

static te_status module_state_load(gpt *m, const module_ref *r, const void *buf, size_t size) {
  switch (r->kind) {
  case MOD_QKV: return te_layernorm_linear_state_load(m->ctx, r->handle, buf, size);
  case MOD_ATTN: return te_attention_state_load(m->ctx, r->handle, buf, size);
  case MOD_MLP: return te_layernorm_mlp_state_load(m->ctx, r->handle, buf, size);
  default: return te_linear_state_load(m->ctx, r->handle, buf, size);
  }
}

static int put_bytes(te_checkpoint *ck, const char *name, const void *data, size_t size) {
  TRY(te_checkpoint_put_bytes(ck, name, data, size));
  return 0;
}

static int save_into(gpt *m, te_checkpoint *ck, const void *extra, size_t extra_size) {
  int64_t shape[SHAPE_FIELDS];
  shape_record(&m->cfg, shape);
  TRY_OK(put_bytes(ck, "gpt.shape", shape, sizeof shape));
  TRY_OK(put_bytes(ck, "gpt.step", &m->steps_done, sizeof m->steps_done));
  /* extra may be empty: store a marker byte so that the record exists and its size says 0 */
  const unsigned char none = 0;
  TRY_OK(put_bytes(ck, "gpt.extra", extra_size ? extra : &none, extra_size ? extra_size : 1));
  uint64_t extra_len = extra_size;
  TRY_OK(put_bytes(ck, "gpt.extra_size", &extra_len, sizeof extra_len));
  char name[MAX_NAME + 16];
  for (size_t i = 0; i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    snprintf(name, sizeof name, "param.%s", p->name);
    TRY(te_checkpoint_put_tensor(ck, m->ctx, name, &p->master));
    snprintf(name, sizeof name, "adam_m.%s", p->name);
    TRY(te_checkpoint_put_tensor(ck, m->ctx, name, &p->exp_avg));
    snprintf(name, sizeof name, "adam_v.%s", p->name);
    TRY(te_checkpoint_put_tensor(ck, m->ctx, name, &p->exp_avg_sq));
  }
  module_ref *mods = calloc((size_t)m->cfg.n_layers * 4 + 1, sizeof *mods);
  if (mods == NULL) return 1;
  const size_t n_mods = list_modules(m, mods);
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < n_mods; ++i) {
    size_t size = 0;
    te_status s = module_state_save(m, &mods[i], NULL, 0, &size);
    void *buf = s == TE_SUCCESS ? malloc(size ? size : 1) : NULL;
    if (s == TE_SUCCESS && buf != NULL) s = module_state_save(m, &mods[i], buf, size, &size);
    if (s == TE_SUCCESS && buf != NULL) s = te_checkpoint_put_bytes(ck, mods[i].name, buf, size);
    if (s != TE_SUCCESS || buf == NULL) {
      fprintf(stderr, "gpt_save: %s: %s: %s\n", mods[i].name, te_status_string(s),
              te_last_error());
      rc = 1;
    }
    free(buf);
  }
  free(mods);
  return rc;
}

int gpt_save(const gpt *mc, const char *path, const void *extra, size_t extra_size) {
  gpt *m = (gpt *)mc; /* state_save and put_tensor take non-const handles; nothing changes */
  if (m == NULL || path == NULL || (extra == NULL && extra_size != 0)) {
    fprintf(stderr, "gpt_save: NULL argument\n");
    return 1;
  }
  te_checkpoint *ck = NULL;
  TRY(te_checkpoint_create(&ck));
  int rc = save_into(m, ck, extra, extra_size);
  if (rc == 0) {
    te_status s = te_checkpoint_write(ck, path);
    if (s != TE_SUCCESS) {
      fprintf(stderr, "gpt_save: writing %s: %s: %s\n", path, te_status_string(s),
              te_last_error());
      rc = 1;
    }
  }
  te_checkpoint_destroy(ck);
  return rc;
}

/* Reads byte record `name` of exactly `size` bytes into buf. */
static int get_exact(const te_checkpoint *ck, const char *path, const char *name, void *buf,
                     size_t size) {
  size_t have = 0;
  te_status s = te_checkpoint_get_bytes(ck, name, NULL, 0, &have);
  if (s != TE_SUCCESS) {
    fprintf(stderr, "gpt_load: %s: record %s: %s\n", path, name, te_last_error());
    return 1;
  }
  if (have != size) {
    fprintf(stderr, "gpt_load: %s: record %s has %zu bytes, expected %zu\n", path, name, have,
            size);
    return 1;
  }
  if (buf != NULL) TRY(te_checkpoint_get_bytes(ck, name, buf, size, &have));
  return 0;
}

static int has_record(const te_checkpoint *ck, const char *name) {
  size_t n = 0;
  if (te_checkpoint_count(ck, &n) != TE_SUCCESS) return 0;
  for (size_t i = 0; i < n; ++i) {
    const char *ni = NULL;
    if (te_checkpoint_name(ck, i, &ni) == TE_SUCCESS && strcmp(ni, name) == 0) return 1;
  }
  return 0;
}

/* Everything is checked before anything is written, so a refused checkpoint leaves the model
 * as it was: the file (te_checkpoint_read: magic, version, lengths, CRC), the shape, every
 * record's presence and size, the module states' sizes. */
static int verify(gpt *m, const te_checkpoint *ck, const char *path, size_t extra_size,
                  const module_ref *mods, size_t n_mods) {
  int64_t want[SHAPE_FIELDS], have[SHAPE_FIELDS];
  shape_record(&m->cfg, want);
  TRY_OK(get_exact(ck, path, "gpt.shape", have, sizeof have));
  int bad = 0;
  for (int i = 0; i < SHAPE_FIELDS; ++i)
    if (want[i] != have[i]) {
      if (!bad)
        fprintf(stderr, "gpt_load: %s is a checkpoint of another model shape:\n", path);
      fprintf(stderr, "  %s: checkpoint %lld, this model %lld\n", SHAPE_NAMES[i],
              (long long)have[i], (long long)want[i]);
      bad = 1;
    }
  if (bad) return 1;
  TRY_OK(get_exact(ck, path, "gpt.step", NULL, sizeof(int64_t)));
  uint64_t saved_extra = 0;
  TRY_OK(get_exact(ck, path, "gpt.extra_size", &saved_extra, sizeof saved_extra));
  if (extra_size != 0 && saved_extra != extra_size) {
    fprintf(stderr, "gpt_load: %s holds %llu caller bytes, expected %zu\n", path,
            (unsigned long long)saved_extra, extra_size);
    return 1;
  }
  char name[MAX_NAME + 16];
  const char *prefixes[3] = {"param.", "adam_m.", "adam_v."};
  for (size_t i = 0; i < m->n_params; ++i)
    for (int j = 0; j < 3; ++j) {
      snprintf(name, sizeof name, "%s%s", prefixes[j], m->params[i].name);
      if (!has_record(ck, name)) {
        fprintf(stderr, "gpt_load: %s has no record %s\n", path, name);
        return 1;
      }
    }
  for (size_t i = 0; i < n_mods; ++i)
    if (!has_record(ck, mods[i].name)) {
      fprintf(stderr, "gpt_load: %s has no record %s\n", path, mods[i].name);
      return 1;
    }
  return 0;
}

int gpt_load(gpt *m, const char *path, void *extra, size_t extra_size) {
  if (m == NULL || path == NULL || (extra == NULL && extra_size != 0)) {
    fprintf(stderr, "gpt_load: NULL argument\n");
    return 1;
  }
  te_checkpoint *ck = NULL;
  te_status s = te_checkpoint_read(&ck, path);
  if (s != TE_SUCCESS) {
    fprintf(stderr, "gpt_load: cannot use %s: %s: %s\n", path, te_status_string(s),
            te_last_error());
    return 1;
  }
  module_ref *mods = calloc((size_t)m->cfg.n_layers * 4 + 1, sizeof *mods);
  if (mods == NULL) {
    te_checkpoint_destroy(ck);
    return 1;
  }
  const size_t n_mods = list_modules(m, mods);
  int rc = verify(m, ck, path, extra_size, mods, n_mods);

  /* Apply. The shape matched, so every tensor has this model's dtype and shape. */
  char name[MAX_NAME + 16];
  for (size_t i = 0; rc == 0 && i < m->n_params; ++i) {
    gpt_param_t *p = &m->params[i];
    te_tensor *dst[3] = {&p->master, &p->exp_avg, &p->exp_avg_sq};
    const char *prefixes[3] = {"param.", "adam_m.", "adam_v."};
    for (int j = 0; rc == 0 && j < 3; ++j) {
      snprintf(name, sizeof name, "%s%s", prefixes[j], p->name);
      s = te_checkpoint_get_tensor(ck, m->ctx, name, dst[j]);
      if (s != TE_SUCCESS) {
        fprintf(stderr, "gpt_load: %s: %s: %s\n", path, name, te_last_error());
        rc = 1;
      }
    }
  }
  for (size_t i = 0; rc == 0 && i < n_mods; ++i) {
    size_t size = 0;
    s = te_checkpoint_get_bytes(ck, mods[i].name, NULL, 0, &size);
    void *buf = s == TE_SUCCESS ? malloc(size ? size : 1) : NULL;
    if (buf != NULL) s = te_checkpoint_get_bytes(ck, mods[i].name, buf, size, &size);
    if (buf != NULL && s == TE_SUCCESS) s = module_state_load(m, &mods[i], buf, size);
    if (buf == NULL || s != TE_SUCCESS) {
      fprintf(stderr, "gpt_load: %s: %s: %s\n", path, mods[i].name, te_last_error());
      rc = 1;
    }
    free(buf);
  }
  if (rc == 0) rc = get_exact(ck, path, "gpt.step", &m->steps_done, sizeof m->steps_done);
  if (rc == 0 && extra_size != 0) rc = get_exact(ck, path, "gpt.extra", extra, extra_size);
  if (rc == 0) rc = gpt_refresh_model_weights(m); /* model copies from the masters; re-cast FP8 */
  free(mods);
  te_checkpoint_destroy(ck);
  return rc;
}
