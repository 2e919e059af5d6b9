// nvFuser's PyPI build for torch 2.10 on a machine with torch 2.11 (a lent device machine has only the latter,
// and no nvFuser for it exists on PyPI). Of every symbol nvFuser takes from torch, only c10::MessageLogger
// changed between the two: 2.11's constructor takes a SourceLocation, and its object is larger than the one
// nvFuser's code reserves on its stack. scripts/device-run.sh renames nvFuser's three imports of that class
// (same length: MessageLogger -> NvfShimLogger) and preloads this library, which provides them with a layout
// that fits: nvFuser's log lines still print; nothing else of torch is touched. A test harness, never shipped.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>

namespace c10 {

class NvfShimLogger {
 public:
  NvfShimLogger(const char* file, int line, int severity, bool exit_on_fatal);
  ~NvfShimLogger() noexcept(false);
  std::stringstream& stream();

 private:
  // nvFuser reserved room for torch 2.10's MessageLogger (a std::stringstream and more): a pointer fits.
  std::stringstream* stream_;
  int severity_;
  bool exit_on_fatal_;
};

NvfShimLogger::NvfShimLogger(const char* file, int line, int severity, bool exit_on_fatal)
    : stream_(new std::stringstream()), severity_(severity), exit_on_fatal_(exit_on_fatal) {
  static const char kSeverity[] = "IWEF";
  *stream_ << "[" << kSeverity[severity < 0 ? 0 : (severity > 3 ? 3 : severity)] << " " << (file ? file : "?") << ":"
           << line << "] ";
}

NvfShimLogger::~NvfShimLogger() noexcept(false) {
  if (severity_ >= 1) {  // c10's default level shows warnings and above
    std::fprintf(stderr, "%s\n", stream_->str().c_str());
  }
  delete stream_;
  if (severity_ >= 3) {  // FATAL
    std::abort();
  }
  (void)exit_on_fatal_;
}

std::stringstream& NvfShimLogger::stream() {
  return *stream_;
}

}  // namespace c10
