/* gpt_data.c: loads the GPT example's text and samples its batches (see gpt_data.h). */
#define _POSIX_C_SOURCE 200809L

#include "gpt_data.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STDLIB_COMMAND "python3 -c \"import sysconfig;print(sysconfig.get_paths()['stdlib'])\""
#define HOW_TO_PASS "pass --data FILE_OR_DIRECTORY with a text file or a directory of text files"

/* A growable list of paths relative to the walked root. */
typedef struct path_list {
  char **items;
  size_t count, capacity;
} path_list;

static void path_list_free(path_list *l) {
  size_t i;
  for (i = 0; i < l->count; ++i) free(l->items[i]);
  free(l->items);
  memset(l, 0, sizeof *l);
}

static int path_list_push(path_list *l, const char *s) {
  char *copy;
  if (l->count == l->capacity) {
    size_t cap = l->capacity ? 2 * l->capacity : 256;
    char **grown = (char **)realloc(l->items, cap * sizeof *grown);
    if (!grown) return -1;
    l->items = grown;
    l->capacity = cap;
  }
  copy = strdup(s);
  if (!copy) return -1;
  l->items[l->count++] = copy;
  return 0;
}

static int compare_paths(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Installed packages, test suites and caches are not the standard library's text. */
static int excluded_directory(const char *name) {
  static const char *const names[] = {"site-packages", "dist-packages", "test", "tests",
                                      "idle_test",     "__pycache__"};
  size_t i;
  for (i = 0; i < sizeof names / sizeof names[0]; ++i)
    if (strcmp(name, names[i]) == 0) return 1;
  return 0;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Collects the regular files under root/rel (symlinks not followed; only *.py when py_only).
 * Returns 0, or -1 when out of memory. Unreadable subdirectories are skipped. */
static int walk(const char *root, const char *rel, int py_only, path_list *out) {
  char dir_path[4096];
  DIR *dir;
  struct dirent *e;
  int rc = 0;
  snprintf(dir_path, sizeof dir_path, "%s%s%s", root, *rel ? "/" : "", rel);
  dir = opendir(dir_path);
  if (!dir) return 0;
  while (rc == 0 && (e = readdir(dir)) != NULL) {
    char child_rel[4096], child_path[8192];
    struct stat st;
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if ((size_t)snprintf(child_rel, sizeof child_rel, "%s%s%s", rel, *rel ? "/" : "", e->d_name) >=
        sizeof child_rel)
      continue; /* a path this long is not worth a failure */
    snprintf(child_path, sizeof child_path, "%s/%s", root, child_rel);
    if (lstat(child_path, &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (!excluded_directory(e->d_name)) rc = walk(root, child_rel, py_only, out);
    } else if (S_ISREG(st.st_mode) && (!py_only || ends_with(e->d_name, ".py"))) {
      rc = path_list_push(out, child_rel);
    }
  }
  closedir(dir);
  return rc;
}

/* Appends up to limit - *size bytes of the file (limit 0: all of it). Returns 0 or an errno. */
static int append_file(const char *path, uint8_t **buf, size_t *size, size_t *capacity,
                       size_t limit) {
  FILE *f = fopen(path, "rb");
  if (!f) return errno ? errno : EIO;
  for (;;) {
    size_t want, got;
    if (limit && *size >= limit) break;
    if (*capacity - *size < 65536) {
      size_t cap = *capacity ? 2 * *capacity : (size_t)1 << 20;
      uint8_t *grown = (uint8_t *)realloc(*buf, cap);
      if (!grown) {
        fclose(f);
        return ENOMEM;
      }
      *buf = grown;
      *capacity = cap;
    }
    want = *capacity - *size;
    if (limit && want > limit - *size) want = limit - *size;
    got = fread(*buf + *size, 1, want, f);
    *size += got;
    if (got < want) {
      int err = ferror(f) ? EIO : 0;
      fclose(f);
      return err;
    }
  }
  fclose(f);
  return 0;
}

static int is_directory(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The directory python3 reports as its standard library, or "" when python3 is missing. */
static void python_stdlib_dir(char *out, size_t n) {
  FILE *p = popen(STDLIB_COMMAND " 2>/dev/null", "r");
  out[0] = '\0';
  if (!p) return;
  if (!fgets(out, (int)n, p)) out[0] = '\0';
  pclose(p);
  out[strcspn(out, "\r\n")] = '\0';
  if (out[0] && !is_directory(out)) out[0] = '\0';
}

/* The newest /usr/lib/python3.N that holds os.py (3.10 after 3.9: N compared as a number). */
static void usr_lib_python_dir(char *out, size_t n) {
  glob_t g;
  size_t i;
  long best = -1;
  out[0] = '\0';
  if (glob("/usr/lib/python3.*", 0, NULL, &g) != 0) return;
  for (i = 0; i < g.gl_pathc; ++i) {
    const char *p = g.gl_pathv[i];
    char os_py[4096], *end;
    long minor = strtol(p + strlen("/usr/lib/python3."), &end, 10);
    struct stat st;
    if (*end != '\0' || minor <= best) continue;
    snprintf(os_py, sizeof os_py, "%s/os.py", p);
    if (stat(os_py, &st) == 0 && S_ISREG(st.st_mode)) {
      best = minor;
      snprintf(out, n, "%s", p);
    }
  }
  globfree(&g);
}

int gpt_text_load(gpt_text *out, const char *path_or_null, size_t max_bytes, FILE *log) {
  char root[4096];
  path_list files = {0};
  uint8_t *buf = NULL;
  size_t size = 0, capacity = 0, used = 0, i;
  int py_only = 0, single_file = 0;
  if (!out) return 1;
  memset(out, 0, sizeof *out);

  if (path_or_null) {
    struct stat st;
    if (stat(path_or_null, &st) != 0) {
      fprintf(stderr, "gpt_data: cannot read the text %s: %s; %s\n", path_or_null,
              strerror(errno), HOW_TO_PASS);
      return 1;
    }
    snprintf(root, sizeof root, "%s", path_or_null);
    single_file = !S_ISDIR(st.st_mode);
  } else {
    char from_python[4096], from_glob[4096];
    python_stdlib_dir(from_python, sizeof from_python);
    from_glob[0] = '\0';
    if (!from_python[0]) usr_lib_python_dir(from_glob, sizeof from_glob);
    if (!from_python[0] && !from_glob[0]) {
      fprintf(stderr,
              "gpt_data: no training text: the default is the Python standard library's .py "
              "sources, and neither `%s` named a directory nor does /usr/lib/python3.*/os.py "
              "exist; install python3 (scripts/install_deps.sh) or %s\n",
              STDLIB_COMMAND, HOW_TO_PASS);
      return 1;
    }
    snprintf(root, sizeof root, "%s", from_python[0] ? from_python : from_glob);
    py_only = 1;
  }

  if (single_file) {
    if (path_list_push(&files, "") != 0) goto out_of_memory;
  } else {
    if (walk(root, "", py_only, &files) != 0) goto out_of_memory;
    if (files.count > 1) qsort(files.items, files.count, sizeof *files.items, compare_paths);
  }

  for (i = 0; i < files.count && (!max_bytes || size < max_bytes); ++i) {
    char path[8192];
    int err;
    if (single_file)
      snprintf(path, sizeof path, "%s", root);
    else
      snprintf(path, sizeof path, "%s/%s", root, files.items[i]);
    err = append_file(path, &buf, &size, &capacity, max_bytes);
    if (err == ENOMEM) goto out_of_memory;
    if (err) {
      fprintf(stderr, "gpt_data: cannot read %s: %s; %s\n", path, strerror(err), HOW_TO_PASS);
      free(buf);
      path_list_free(&files);
      return 1;
    }
    used = i + 1;
  }

  if (size == 0) {
    fprintf(stderr, "gpt_data: no text in %s (%s%zu files%s); %s\n", root,
            py_only ? "looked for *.py files outside site-packages and test directories: " : "",
            files.count, single_file ? ", an empty file" : "", HOW_TO_PASS);
    free(buf);
    path_list_free(&files);
    return 1;
  }

  out->bytes = buf;
  out->size = size;
  out->train_size = size - size / 10; /* the last 10% validates */
  if (log) {
    if (single_file) {
      fprintf(log, "data: %s: %zu bytes%s\n", root, size,
              max_bytes && size == max_bytes ? " (cut at the size limit)" : "");
    } else {
      fprintf(log, "data: %s%s: %zu of %zu files (%s, sorted by path), %zu bytes%s\n", root,
              py_only ? " (the Python standard library)" : "", used, files.count,
              py_only ? "*.py outside site-packages, dist-packages, test, tests, idle_test"
                      : "every regular file outside site-packages, dist-packages, test, tests, "
                        "idle_test, __pycache__",
              size, max_bytes && size == max_bytes ? " (cut at the size limit)" : "");
      fprintf(log, "data: first file %s, last file %s\n", files.items[0], files.items[used - 1]);
    }
    fprintf(log, "data: train %zu bytes, validation %zu bytes (the last 10%%)\n", out->train_size,
            out->size - out->train_size);
  }
  path_list_free(&files);
  return 0;

out_of_memory:
  fprintf(stderr, "gpt_data: out of memory reading the text under %s\n", root);
  free(buf);
  path_list_free(&files);
  return 1;
}

void gpt_text_free(gpt_text *t) {
  if (!t) return;
  free(t->bytes);
  memset(t, 0, sizeof *t);
}

int gpt_text_check(const gpt_text *t, int seq, FILE *log) {
  size_t need = (size_t)(seq > 0 ? seq : 0) + 1, val;
  if (!log) log = stderr;
  if (!t || !t->bytes || seq < 1) {
    fprintf(log, "gpt_data: no text loaded or seq %d < 1\n", seq);
    return 1;
  }
  val = t->size - t->train_size;
  if (t->train_size < need || val < need) {
    fprintf(log,
            "gpt_data: the text is too short for seq %d: the train split has %zu bytes and the "
            "validation split (the last 10%%) %zu, and each needs at least seq + 1 = %zu; use a "
            "longer text (--data) or a smaller --seq\n",
            seq, t->train_size, val, need);
    return 1;
  }
  return 0;
}

void gpt_sampler_init(gpt_sampler *s, uint64_t seed) { s->state = seed; }

/* splitmix64 (Steele, Lea, Flood 2014): one 64-bit state, full period, good enough to place
 * windows. */
static uint64_t next_u64(gpt_sampler *s) {
  uint64_t z = (s->state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void gpt_sample_batch(gpt_sampler *s, const gpt_text *t, int val, int batch, int seq,
                      int32_t *tokens, int32_t *targets) {
  const uint8_t *split = t->bytes + (val ? t->train_size : 0);
  size_t n = val ? t->size - t->train_size : t->train_size;
  int b, i;
  for (b = 0; b < batch; ++b) {
    uint64_t r = next_u64(s);
    int32_t *tok = tokens + (size_t)b * seq, *tgt = targets + (size_t)b * seq;
    if (n >= (size_t)seq + 1) {
      /* Starts 0 .. n - seq - 1: the window's seq + 1 bytes stay inside the split. */
      const uint8_t *w = split + (size_t)(r % (n - (size_t)seq));
      for (i = 0; i < seq; ++i) {
        tok[i] = w[i];
        tgt[i] = w[i + 1];
      }
    } else if (n > 0) { /* too short (gpt_text_check refuses it): cyclic, never out of bounds */
      size_t start = (size_t)(r % n);
      for (i = 0; i < seq; ++i) {
        tok[i] = split[(start + (size_t)i) % n];
        tgt[i] = split[(start + (size_t)i + 1) % n];
      }
    } else {
      for (i = 0; i < seq; ++i) tok[i] = tgt[i] = 0;
    }
  }
}
