// Mixed precision (train.precision): "bf16" runs a micro-batch's forward under LibTorch's autocast,
// so matrix products and convolutions compute in bfloat16 while the parameters, their gradients
// and the optimizer stay float32 (the loss too: autocast keeps reductions such as cross-entropy
// in float32). Backward runs outside the scope, as autocast wants: each operation's backward
// follows the precision its forward ran in.
#pragma once

#include <string>

namespace hetra::train {

// The forward of one micro-batch in `precision` ("fp32": no change; "bf16": autocast to bfloat16
// on the CPU) for the scope's lifetime, on the calling thread. Scopes do not nest.
class ForwardPrecision {
 public:
  explicit ForwardPrecision(const std::string& precision);
  ~ForwardPrecision();
  ForwardPrecision(const ForwardPrecision&) = delete;
  ForwardPrecision& operator=(const ForwardPrecision&) = delete;

 private:
  bool enabled_ = false;
};

}  // namespace hetra::train
