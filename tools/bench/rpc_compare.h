// What `bench rpc` prints about the sides it measured: each side's figures,
// ratios against raw TCP, PyTorch and PIPE over TCP measured in the same
// run, and the targets (met / missed / unknown). Lines go to stdout as
// `name=value` (tools/bench/report.h).
#pragma once

#include <map>
#include <optional>
#include <string>

namespace switchboard::bench {

// A side's figures by name ("rtt_us_p50", ...; raw TCP's: "oneway_GBps").
using Figures = std::map<std::string, double>;

void print_number(const std::string& name, double value, int precision);
// `<prefix>_<figure>` for every figure a side reports.
void print_side(const std::string& prefix, const Figures& figures);
// Ratios and targets of one of our backends (`label` names it in comments).
void compare(const std::string& prefix, const std::string& label, const Figures& ours,
             const Figures& tcp, const std::optional<Figures>& torch);
// What TLS costs: each figure over PIPE over TCP's (`plain`; null: not
// measured in this run).
void compare_tls(const std::string& prefix, const std::string& label, const Figures& with,
                 const Figures* plain);
// The same-host lane's own targets, against raw TCP, PIPE over TCP (null:
// not measured) and torch.
void compare_lane(const Figures& shm, const Figures& tcp, const Figures* pipe_tcp,
                  const std::optional<Figures>& torch);
// PyTorch's API on both sides: over the SWITCHBOARD backend against
// TENSORPIPE (`tensorpipe`; nullopt: not measured), and issue 25's targets.
void compare_torch_backends(const Figures& switchboard, const std::optional<Figures>& tensorpipe);

}  // namespace switchboard::bench
