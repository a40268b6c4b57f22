// Physical limit for the collective benchmarks: single-thread memcpy bandwidth of a buffer much
// larger than the caches. GB/s = bytes copied / time / 1e9 (the memory traffic is about twice that:
// one read, one write). Every byte a shared-memory collective moves between ranks is copied at
// least once by some core, so on a machine with one core per rank this is roughly the ceiling for
// busbw.
//
// Build: cc -O2 -o build-bench/memcpy_bw bench/peers/memcpy_bw.c
// Run:   build-bench/memcpy_bw [MiB=256] [reps=9]

#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
  int reps = argc > 2 ? atoi(argv[2]) : 9;
  if (mib == 0 || reps < 1) {
    fprintf(stderr, "usage: %s [MiB>0] [reps>0]\n", argv[0]);
    return 2;
  }
  size_t bytes = mib << 20;
  char* src = malloc(bytes);
  char* dst = malloc(bytes);
  double* secs = malloc((size_t)reps * sizeof(double));
  if (!src || !dst || !secs) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  // Fault every page in before timing; the first copy is a further untimed warm-up.
  memset(src, 1, bytes);
  memset(dst, 2, bytes);
  memcpy(dst, src, bytes);
  for (int r = 0; r < reps; ++r) {
    src[(size_t)r * 4096 % bytes] =
        (char)r;  // keep the compiler from treating the copies as redundant
    double t0 = now();
    memcpy(dst, src, bytes);
    secs[r] = now() - t0;
  }
  qsort(secs, (size_t)reps, sizeof(double), cmpDouble);
  double median = reps % 2 ? secs[reps / 2] : 0.5 * (secs[reps / 2 - 1] + secs[reps / 2]);
  printf("memcpy %zu MiB single thread: median %.3f GB/s (best %.3f, worst %.3f, %d reps)\n", mib,
         (double)bytes / median / 1e9, (double)bytes / secs[0] / 1e9,
         (double)bytes / secs[reps - 1] / 1e9, reps);
  volatile char sink = dst[bytes - 1];
  (void)sink;
  free(src);
  free(dst);
  free(secs);
  return 0;
}
