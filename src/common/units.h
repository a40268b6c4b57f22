// Quantities written as text (config keys, HETRA_* variables, CLI flags): one parser per kind, so
// "48MiB", "1gbit" or "5us" mean the same everywhere. Each throws ConfigError quoting the text and
// naming the accepted units.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace hetra {

// Whole bytes: a decimal number (no exponent) and an optional case-insensitive unit, spaces allowed
// around and between them: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of
// 1024). A fraction must come out whole: "1.5GB" and "0.001KB" are fine, "0.3B" is not.
int64_t parseBytes(const std::string& text);

// The shortest exact form parseBytes reads back: 48 << 20 -> "48MiB", 1500000000 -> "1500MB",
// 1536 -> "1536".
std::string formatBytes(int64_t bytes);

// Whether a rate must spell its unit as a rate. Required where a bare number or "5GB" could be
// misread, e.g. beside a latency in a link cost "5us,5GB/s".
enum class RateUnit { kOptional, kRequired };

// Bytes per second, >= 0: a number (exponents allowed) and a case-insensitive unit: a byte unit of
// parseBytes followed by "/s" ("20MB/s", "512KiB/s"), or bits: bit, kbit, mbit, gbit (powers of
// 1000 bits, optionally "/s"). With RateUnit::kOptional the "/s" may be left out ("125MB") and a
// bare number is bytes per second. `what` names the setting in the error.
double parseRate(const std::string& text, const std::string& what,
                 RateUnit rule = RateUnit::kOptional);

// Seconds, >= 0: a number (exponents allowed) and one of s, ms, us, ns (case-insensitive), e.g.
// "5us", "0.5ms", "2e-6s". The unit is required: a bare "5" could be any of them.
double parseSeconds(const std::string& text, const std::string& what);

// The whole of `text` as std::stoll / std::stod read it (leading spaces allowed, nothing left
// over), else nullopt, for callers that word their own error: plain numbers, no units.
std::optional<int64_t> wholeInteger(const std::string& text);
std::optional<double> wholeNumber(const std::string& text);

}  // namespace hetra
