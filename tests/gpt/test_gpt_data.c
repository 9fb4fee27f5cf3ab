/* test_gpt_data.c: the GPT example's text loader and batch sampler (examples/c/gpt/gpt_data.c).
 * ctest gpt.data. Exit 0 when every check passes, 1 otherwise (each failure is printed). */
#define _POSIX_C_SOURCE 200809L

#include "gpt_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures = 0;
#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

static void write_file(const char *dir, const char *name, const char *text) {
  char path[1024];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
}

static void make_dir(const char *dir, const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (mkdir(path, 0700) != 0) {
    perror(path);
    exit(1);
  }
}

/* Every window lies inside its split, and targets are the tokens shifted by one. */
static void check_batch(const gpt_text *t, int val, int batch, int seq, const int32_t *tok,
                        const int32_t *tgt) {
  const uint8_t *split = t->bytes + (val ? t->train_size : 0);
  size_t n = val ? t->size - t->train_size : t->train_size;
  int b, i;
  for (b = 0; b < batch; ++b) {
    const int32_t *x = tok + (size_t)b * seq, *y = tgt + (size_t)b * seq;
    size_t s;
    int found = 0;
    for (i = 0; i + 1 < seq; ++i) CHECK(y[i] == x[i + 1]);
    for (s = 0; s + (size_t)seq + 1 <= n && !found; ++s) {
      found = 1;
      for (i = 0; i < seq && found; ++i) found = split[s + i] == x[i] && split[s + i + 1] == y[i];
    }
    CHECK(found);
  }
}

int main(void) {
  char dir[] = "/tmp/te_gpt_data_XXXXXX";
  char missing[1100];
  const char *a = "alpha line one\nalpha line two\n";          /* a/x.txt */
  const char *b = "beta: the second file, sorted after a/x\n"; /* b.txt */
  char expected[256];
  gpt_text t, t2;
  gpt_sampler s1, s2, s3;
  enum { BATCH = 4, SEQ = 5 };
  int32_t tok1[BATCH * SEQ], tgt1[BATCH * SEQ], tok2[BATCH * SEQ], tgt2[BATCH * SEQ];
  int k;

  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  make_dir(dir, "a");
  make_dir(dir, "site-packages");
  make_dir(dir, "test");
  write_file(dir, "b.txt", b);
  write_file(dir, "a/x.txt", a);
  write_file(dir, "site-packages/skipped.txt", "SKIPPED");
  write_file(dir, "test/skipped.txt", "SKIPPED");

  /* A directory: its files in sorted path order, the excluded directories left out. */
  snprintf(expected, sizeof expected, "%s%s", a, b);
  CHECK(gpt_text_load(&t, dir, 0, stdout) == 0);
  CHECK(t.size == strlen(expected));
  CHECK(t.bytes && memcmp(t.bytes, expected, t.size) == 0);
  CHECK(t.train_size == t.size - t.size / 10);
  CHECK(t.size - t.train_size >= t.size / 10 && t.train_size > 0);

  /* max_bytes cuts the text there. */
  CHECK(gpt_text_load(&t2, dir, 20, NULL) == 0);
  CHECK(t2.size == 20 && memcmp(t2.bytes, expected, 20) == 0 && t2.train_size == 18);
  gpt_text_free(&t2);
  CHECK(t2.bytes == NULL && t2.size == 0);

  /* One file. */
  {
    char file[1100];
    snprintf(file, sizeof file, "%s/b.txt", dir);
    CHECK(gpt_text_load(&t2, file, 0, stdout) == 0);
    CHECK(t2.size == strlen(b) && memcmp(t2.bytes, b, t2.size) == 0);
    gpt_text_free(&t2);
  }

  /* Sampling: deterministic per seed; windows inside their split; targets shifted tokens. */
  CHECK(gpt_text_check(&t, SEQ, stdout) == 0);
  gpt_sampler_init(&s1, 1234);
  gpt_sampler_init(&s2, 1234);
  for (k = 0; k < 10; ++k) {
    int val = k % 2;
    gpt_sample_batch(&s1, &t, val, BATCH, SEQ, tok1, tgt1);
    gpt_sample_batch(&s2, &t, val, BATCH, SEQ, tok2, tgt2);
    CHECK(memcmp(tok1, tok2, sizeof tok1) == 0 && memcmp(tgt1, tgt2, sizeof tgt1) == 0);
    check_batch(&t, val, BATCH, SEQ, tok1, tgt1);
  }
  /* The state is plain data: a copy (a checkpoint) continues the same sequence. */
  s3 = s1;
  gpt_sample_batch(&s1, &t, 0, BATCH, SEQ, tok1, tgt1);
  gpt_sample_batch(&s3, &t, 0, BATCH, SEQ, tok2, tgt2);
  CHECK(memcmp(tok1, tok2, sizeof tok1) == 0);
  /* Another seed draws other windows (64 draws from 60 starts all equal: not by chance). */
  {
    int differ = 0;
    gpt_sampler_init(&s1, 1);
    gpt_sampler_init(&s2, 2);
    for (k = 0; k < 16 && !differ; ++k) {
      gpt_sample_batch(&s1, &t, 0, BATCH, SEQ, tok1, tgt1);
      gpt_sample_batch(&s2, &t, 0, BATCH, SEQ, tok2, tgt2);
      differ = memcmp(tok1, tok2, sizeof tok1) != 0;
    }
    CHECK(differ);
  }
  /* Too short for the sequence: the validation split has 7 bytes. */
  CHECK(gpt_text_check(&t, 7, stdout) != 0);
  CHECK(gpt_text_check(&t, 6, NULL) == 0);
  gpt_text_free(&t);

  /* A missing path is an error with a message, and the output stays zeroed. */
  snprintf(missing, sizeof missing, "%s/no-such-file", dir);
  memset(&t, 0x55, sizeof t);
  CHECK(gpt_text_load(&t, missing, 0, stdout) != 0);
  CHECK(t.bytes == NULL && t.size == 0 && t.train_size == 0);
  /* A directory with no text (only excluded ones) too. */
  {
    char empty[1100];
    make_dir(dir, "e");
    make_dir(dir, "e/test");
    write_file(dir, "e/test/t.txt", "x");
    snprintf(empty, sizeof empty, "%s/e", dir);
    CHECK(gpt_text_load(&t, empty, 0, NULL) != 0);
  }

  /* The default text: the Python standard library (python3 is part of the README's setup). */
  CHECK(gpt_text_load(&t, NULL, 65536, stdout) == 0);
  CHECK(t.size == 65536 && t.train_size == 65536 - 6553);
  gpt_text_free(&t);

  {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  if (failures) {
    fprintf(stderr, "test_gpt_data: %d check(s) failed\n", failures);
    return 1;
  }
  printf("test_gpt_data: all checks passed\n");
  return 0;
}
