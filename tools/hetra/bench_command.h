// `hetra bench <collective>`: collective benchmarks in the style of NVIDIA's nccl-tests.
#pragma once

#include <string>
#include <vector>

#include "comm/reduce.h"
#include "common/dtype.h"

namespace hetra::cli {

struct BenchOptions {
  std::string collective;  // allreduce | reducescatter | allgather | broadcast
  size_t minBytes = 8;
  size_t maxBytes = 64 << 20;
  double factor = 4;
  int warmup = 5;
  int iters = 20;
  bool check = true;
  DType dtype = DType::F32;
  comm::ReduceOp op = comm::ReduceOp::Sum;
  std::string transport = "auto";
  // Codec of the bytes on the wire (comm/codec/codec.h names); float32 sum/avg only. Results are
  // then checked against the codec's error bound instead of exactly.
  std::string compression = "none";
  // Providers forced as HETRA_ALGO forces them (comm/providers/registry.h); "" follows HETRA_ALGO.
  std::string algo;
  std::string jsonPath;
  int timeoutMs = 60000;
};

// Runs the benchmark as one rank of a job described by the environment (rank 0 prints the table).
int runBenchRank(const BenchOptions& options);

// "8", "4K", "1M", "64M", "1G" (a lone K, M, G: powers of 1024) or any form of parseBytes
// ("48MiB", "1GB") to bytes; throws ConfigError naming the value.
size_t parseSize(const std::string& text);

}  // namespace hetra::cli
