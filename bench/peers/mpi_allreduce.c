// Peer benchmark: Open MPI MPI_Allreduce (float32, sum), nccl-tests style, same flags, table and
// JSON as `hetra bench allreduce` so the two can be compared side by side.
//
// Vocabulary: size = bytes of one rank's buffer; count = size / 4 floats; algbw = size / time;
// busbw = algbw * 2(n-1)/n (the ring-equivalent bytes each rank moves, so busbw is comparable
// across n). Timing: before every iteration all ranks meet in MPI_Barrier, then each rank times its
// own MPI_Allreduce; the iteration's time is the max over ranks, and the reported time is the
// median over the -n iterations. Check (-c 1): inputs are small integers distinct per rank and
// element, so the float sum is exact whatever the reduction order; the result of the first
// iteration (warm-up or timed) is compared element by element.
//
// Build: mpicc -O2 -o build-bench/mpi_allreduce bench/peers/mpi_allreduce.c
// Run:   mpirun --allow-run-as-root -np 2 --mca pml ob1 --mca btl self,vader
// build-bench/mpi_allreduce -b 8 -e 64M

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  size_t minBytes, maxBytes;
  double factor;
  int warmup, iters, check;
  const char* jsonPath;
} Options;

static void usage(const char* argv0) {
  fprintf(
      stderr,
      "usage: %s [-b MIN] [-e MAX] [-f FACTOR] [-w WARMUP] [-n ITERS] [-c 0|1] [--dtype float32]"
      " [--json PATH]\n  sizes accept K/M/G suffixes (powers of 1024)\n",
      argv0);
}

static size_t parseSize(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (end == s || v < 0) {
    fprintf(stderr, "bad size '%s'\n", s);
    exit(2);
  }
  switch (*end) {
    case 'k':
    case 'K':
      v *= 1024.0;
      break;
    case 'm':
    case 'M':
      v *= 1024.0 * 1024.0;
      break;
    case 'g':
    case 'G':
      v *= 1024.0 * 1024.0 * 1024.0;
      break;
    case '\0':
      break;
    default:
      fprintf(stderr, "bad size '%s'\n", s);
      exit(2);
  }
  return (size_t)v;
}

static Options parseArgs(int argc, char** argv) {
  Options o = {8, 64u << 20, 2.0, 5, 20, 1, NULL};
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(argv[0]);
      exit(0);
    }
    if (!v) {
      usage(argv[0]);
      exit(2);
    }
    if (!strcmp(a, "-b"))
      o.minBytes = parseSize(v);
    else if (!strcmp(a, "-e"))
      o.maxBytes = parseSize(v);
    else if (!strcmp(a, "-f"))
      o.factor = atof(v);
    else if (!strcmp(a, "-w"))
      o.warmup = atoi(v);
    else if (!strcmp(a, "-n"))
      o.iters = atoi(v);
    else if (!strcmp(a, "-c"))
      o.check = atoi(v);
    else if (!strcmp(a, "--json"))
      o.jsonPath = v;
    else if (!strcmp(a, "--dtype")) {
      if (strcmp(v, "float32")) {
        fprintf(stderr, "only --dtype float32 is supported\n");
        exit(2);
      }
    } else {
      usage(argv[0]);
      exit(2);
    }
    ++i;
  }
  if (o.factor <= 1.0 || o.iters < 1 || o.warmup < 0 || o.minBytes < sizeof(float) ||
      o.maxBytes < o.minBytes) {
    fprintf(stderr, "need -f > 1, -n >= 1, -w >= 0, 4 <= -b <= -e\n");
    exit(2);
  }
  return o;
}

// Small integers in [-30, 30]: every partial sum of up to 2^18 ranks is exact in float32.
static float inputValue(size_t i, int rank) {
  return (float)((int)((i * 7 + (size_t)rank * 13) % 61) - 30);
}

static int cmpDouble(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  Options o = parseArgs(argc, argv);

  size_t maxCount = o.maxBytes / sizeof(float);
  float* send = malloc(maxCount * sizeof(float));
  float* recv = malloc(maxCount * sizeof(float));
  double* times = malloc((size_t)o.iters * sizeof(double));
  double* maxTimes = malloc((size_t)o.iters * sizeof(double));
  if (!send || !recv || !times || !maxTimes) {
    fprintf(stderr, "rank %d: out of memory\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < maxCount; ++i) {
    send[i] = inputValue(i, rank);
    recv[i] = 0.0f;  // touch the pages now so first-touch faults do not land in the timed loop
  }

  FILE* json = NULL;
  if (rank == 0) {
    if (o.jsonPath && !(json = fopen(o.jsonPath, "w"))) {
      fprintf(stderr, "cannot open %s\n", o.jsonPath);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    printf("# MPI_Allreduce float32 sum, %d ranks, warmup %d, iters %d, check %d\n", nranks,
           o.warmup, o.iters, o.check);
    printf("#%12s %12s %8s %12s %12s %12s %8s\n", "size(B)", "count", "type", "time(us)",
           "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    if (json) fprintf(json, "[");
  }
  // Like nccl-tests, warm up at the largest and the smallest size before the sweep, so the first
  // row does not pay for connection setup, first-touch faults and the library's lazy
  // initialisation.
  size_t warmCounts[2] = {maxCount, o.minBytes / sizeof(float)};
  for (int k = 0; k < 2; ++k)
    for (int it = 0; it < o.warmup; ++it)
      MPI_Allreduce(send, recv, (int)warmCounts[k], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  const double busFactor = 2.0 * (nranks - 1) / nranks;
  int firstRow = 1;
  long long totalWrong = 0;
  for (double sz = (double)o.minBytes; sz <= (double)o.maxBytes * (1 + 1e-9); sz *= o.factor) {
    size_t count = (size_t)sz / sizeof(float);
    size_t bytes = count * sizeof(float);
    long long wrong = -1;
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t1 = MPI_Wtime();
      if (it >= o.warmup) times[it - o.warmup] = t1 - t0;
      if (it == 0 && o.check) {
        long long mine = 0;
        for (size_t i = 0; i < count; ++i) {
          float expect = 0.0f;
          for (int r = 0; r < nranks; ++r) expect += inputValue(i, r);
          mine += recv[i] != expect;
        }
        MPI_Allreduce(&mine, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        totalWrong += wrong;
      }
    }
    MPI_Reduce(times, maxTimes, o.iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      qsort(maxTimes, (size_t)o.iters, sizeof(double), cmpDouble);
      double t = o.iters % 2 ? maxTimes[o.iters / 2]
                             : 0.5 * (maxTimes[o.iters / 2 - 1] + maxTimes[o.iters / 2]);
      double algbw = (double)bytes / t / 1e9;
      double busbw = algbw * busFactor;
      char wrongText[32];
      if (wrong >= 0)
        snprintf(wrongText, sizeof wrongText, "%lld", wrong);
      else
        snprintf(wrongText, sizeof wrongText, "N/A");
      printf(" %12zu %12zu %8s %12.2f %12.3f %12.3f %8s\n", bytes, count, "float32", t * 1e6, algbw,
             busbw, wrongText);
      fflush(stdout);
      if (json) {
        fprintf(json,
                "%s\n  {\"bytes\": %zu, \"count\": %zu, \"dtype\": \"float32\", \"time_us\": %.3f, "
                "\"algbw_gbs\": %.6f, "
                "\"busbw_gbs\": %.6f, \"wrong\": %s}",
                firstRow ? "" : ",", bytes, count, t * 1e6, algbw, busbw,
                wrong >= 0 ? wrongText : "null");
      }
    }
    firstRow = 0;
  }
  if (json) {
    fprintf(json, "\n]\n");
    fclose(json);
  }
  free(send);
  free(recv);
  free(times);
  free(maxTimes);
  MPI_Finalize();
  return totalWrong ? 1 : 0;  // a wrong result must fail the run, not just print a number
}
