// `paratrain report METRICS.jsonl [--trace DIR] -o FILE`: one self-contained HTML page of a
// run's charts (monitor/report.h, docs/report.md). Bad input (a malformed metrics line, a
// missing file, a bad trace) is an InputError: exit 2 with one line naming file and line.
#pragma once

namespace paratrain::cli {

int run_report(int argc, char** argv);

}  // namespace paratrain::cli
