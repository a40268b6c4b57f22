// Collectives whose bytes on the wire are encoded by a Codec (fp16, bf16, fp8) while every
// reduction happens in float32, for groups that cross slow links.
//
// A ring that casts partial sums to the wire format at every hop rounds n-1 times, so its error
// grows with the world size. Here each input is encoded once by its owner and sent straight to the
// rank that reduces that chunk; the reducer adds the n contributions in float32 and encodes the
// result once; every rank (the reducer too) decodes those same bytes, so all ranks end bitwise
// identical. Per element the error is at most
//   u * (sum over ranks of the absolute maximum of the element's block in that rank's input)
//   + u * (absolute maximum of the element's block in the sum),
// where u is the codec's unit roundoff (fp16 2^-11, bf16 2^-8, fp8-e4m3 2^-4, fp8-e5m2 2^-3, for
// values in the format's range): it does not depend on the number of ranks beyond the sum itself.
// Each rank sends (n-1)/n of the encoded buffer per phase, as a ring would.
#pragma once

#include "comm/algorithms/args.h"
#include "comm/codec/codec.h"
#include "comm/transport/transport.h"

namespace hetra::comm {

// Error feedback (args.residual): what the encodings lost is added to the next call's values, so
// over many calls nothing is lost, only delayed; the sum of the results stays within a bounded
// distance of the sum of the exact results. Rank r keeps in residual's block b != r what its
// encoding of its input (plus residual) lost, and in block r what the encoding of the reduced
// block lost. Each rank's residual is its own.
//
// float32 only; op Sum or Avg (reduced as Sum: the caller divides).
void allreduceCompressed(Transport& transport, const AllreduceArgs& args, const Codec& codec);
// The reduced block is exact float32 (only the inputs were encoded). With error feedback
// (args.residual, shaped as the input) rank r keeps in block b != r what its encoding of block b
// lost; block r, never encoded, stays as it is.
void reduceScatterCompressed(Transport& transport, const ReduceScatterArgs& args,
                             const Codec& codec);
// Every rank, the owner of a block too, receives decode(encode(block)).
void allgatherCompressed(Transport& transport, const AllgatherArgs& args, const Codec& codec);

}  // namespace hetra::comm
