/* gpt_data.h: the GPT example's training text and its batch sampler (plain C99 + POSIX, no libte).
 *
 * Text: bytes are tokens (vocab 256), so no tokenizer is needed. By default the text is the Python
 * standard library's .py sources installed with python3 (real text that every machine the README's
 * setup leaves behind has, with no download): the directory `python3 -c "import sysconfig;
 * print(sysconfig.get_paths()['stdlib'])"` prints, else the newest /usr/lib/python3.N holding os.py.
 * Every regular *.py file under it, recursively, except in directories named site-packages,
 * dist-packages, test, tests, idle_test or __pycache__ (installed packages and the test suites),
 * symlinks not followed; sorted by relative path (byte order, strcmp), so two machines with the
 * same Python read the same bytes; concatenated until max_bytes (the last file cut there).
 * bench/gpt_torch_peer.py reads the same files the same way.
 * A path instead: one file, or a directory whose regular files (all of them, any extension, same
 * exclusions and order) are concatenated.
 *
 * Split: the last 10% of the bytes are the validation text, [train_size, size); the rest trains.
 * Call gpt_text_check() with the sequence length before sampling: it refuses (with a message) a
 * text whose train or validation split is shorter than seq + 1 bytes. */
#ifndef GPT_DATA_H
#define GPT_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gpt_text {
  uint8_t *bytes;
  size_t size;
  size_t train_size; /* [0, train_size) train, [train_size, size) validation */
} gpt_text;

/* Loads the text (see above). path_or_null NULL: the Python standard library. max_bytes 0: no
 * limit. Prints what it read to log (may be NULL): the directory or file, the number of files, the
 * total bytes, the first and last file names, and the split. Returns 0, or nonzero after printing
 * to stderr what was looked for and how to pass --data; *out is then zeroed. */
int gpt_text_load(gpt_text *out, const char *path_or_null, size_t max_bytes, FILE *log);
void gpt_text_free(gpt_text *t);

/* 0 when both splits hold at least one window of seq + 1 bytes; else prints why to log (or
 * stderr when log is NULL) and returns nonzero. */
int gpt_text_check(const gpt_text *t, int seq, FILE *log);

/* A splitmix64 state: plain data, so a checkpoint stores it and a resumed run draws the same
 * batches. */
typedef struct gpt_sampler {
  uint64_t state;
} gpt_sampler;

void gpt_sampler_init(gpt_sampler *s, uint64_t seed);

/* batch random windows of seq + 1 bytes from the train (val 0) or validation (val != 0) split:
 * tokens[b * seq + i] = window[i], targets[b * seq + i] = window[i + 1] (row-major [batch, seq]).
 * Each window start is one draw from s. A split shorter than seq + 1 (which gpt_text_check
 * refuses) reads cyclically instead of out of bounds. */
void gpt_sample_batch(gpt_sampler *s, const gpt_text *t, int val, int batch, int seq,
                      int32_t *tokens, int32_t *targets);

#ifdef __cplusplus
}
#endif

#endif /* GPT_DATA_H */
