"""The CPU's ISA flags as /proc/cpuinfo lists them (the first "flags" line;
empty on aarch64 and where /proc/cpuinfo has none). Shared by the CLI tests."""


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()
