// Prints the name of every metric family snip's exporter serves, one a line
// (monitor::metric_table()): the list check_deploy.py holds the dashboard's
// and the alert rules' PromQL against.
#include <cstdio>

#include "snip/monitor/exporter.h"

int main() {
  for (const snip::monitor::MetricInfo& m : snip::monitor::metric_table()) std::printf("%s\n", m.name);
  return 0;
}
