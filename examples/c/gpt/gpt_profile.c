/*
 * gpt_profile.c: GPT_PROFILE=1: each libte call of a step timed alone (the stream synchronised
 * around it), summed per function, and printed by gpt_profile. See gpt_internal.h's PROFILED.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "gpt_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static double prof_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double gpt_prof_start(gpt *m) {
  if (!m->profile) return 0;
  te_context_synchronize(m->ctx); /* what earlier calls queued is not this call's time */
  return prof_now();
}

void gpt_prof_add(gpt *m, const char *call_text, double t0) {
  te_context_synchronize(m->ctx); /* the call's queued work is its time */
  const double seconds = prof_now() - t0;
  size_t len = strcspn(call_text, "(");
  if (len >= sizeof m->prof[0].name) len = sizeof m->prof[0].name - 1;
  int i = 0;
  while (i < m->n_prof && (strncmp(m->prof[i].name, call_text, len) != 0 || m->prof[i].name[len] != '\0'))
    ++i;
  if (i == m->n_prof) {
    if (m->n_prof == (int)(sizeof m->prof / sizeof m->prof[0])) return;
    memcpy(m->prof[i].name, call_text, len);
    m->prof[i].name[len] = '\0';
    m->prof[i].seconds = 0;
    m->prof[i].calls = 0;
    m->n_prof++;
  }
  m->prof[i].seconds += seconds;
  m->prof[i].calls += 1;
}

void gpt_profile(const gpt *m, FILE *out) {
  if (m == NULL || !m->profile || m->n_prof == 0) return;
  double total = 0;
  for (int i = 0; i < m->n_prof; ++i) total += m->prof[i].seconds;
  int order[48];
  for (int i = 0; i < m->n_prof; ++i) order[i] = i;
  for (int i = 1; i < m->n_prof; ++i) /* by time, largest first */
    for (int k = i; k > 0 && m->prof[order[k]].seconds > m->prof[order[k - 1]].seconds; --k) {
      const int t = order[k];
      order[k] = order[k - 1];
      order[k - 1] = t;
    }
  fprintf(out,
          "profile (GPT_PROFILE=1: the stream synchronised around each call; steps %lld..%lld, "
          "evaluation forwards included):\n",
          (long long)m->prof_from + 1, (long long)m->steps_done);
  fprintf(out, "  %-40s %8s %10s %10s %6s\n", "call", "calls", "total ms", "per call", "share");
  for (int r = 0; r < m->n_prof; ++r) {
    const int i = order[r];
    fprintf(out, "  %-40s %8ld %10.2f %10.4f %5.1f%%\n", m->prof[i].name, m->prof[i].calls,
            1e3 * m->prof[i].seconds, 1e3 * m->prof[i].seconds / (double)m->prof[i].calls,
            100.0 * m->prof[i].seconds / total);
  }
}
