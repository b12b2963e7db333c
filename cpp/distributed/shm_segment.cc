#include "distributed/shm_segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace pagedcore {
namespace distributed {
namespace {

std::string errno_text(const std::string& what, const std::string& name) {
  return what + " /dev/shm/" + name + ": " + std::strerror(errno);
}

// The fields of a /proc stat file after the command name (which may hold spaces and parentheses):
// fields[0] is field 3 (state), fields[19] field 22 (start time).
bool read_stat_fields(const std::string& path, std::string* state, uint64_t* start_time) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3) *state = field;
    if (i == 22) {
      *start_time = std::stoull(field);
      return true;
    }
  }
  return false;
}

}  // namespace

uint64_t process_start_time(int pid) {
  // Through the main thread's task entry, which gives the process's start time as /proc/<pid>/stat does on
  // Linux, because QEMU's user-mode emulator answers /proc/self/stat and /proc/<own pid>/stat itself: one
  // tick off in the process it started, and the parent's value in a forked child, while other processes read
  // the kernel's. A peer then took a live process for a reused pid (the emulated CI runs, 2026-12-05).
  const std::string id = std::to_string(pid);
  std::string state;
  uint64_t start = 0;
  return read_stat_fields("/proc/" + id + "/task/" + id + "/stat", &state, &start) ? start : 0;
}

std::string process_gone_reason(int pid, uint64_t start_time) {
  if (pid <= 0) return "";
  std::string state;
  uint64_t start = 0;
  if (!read_stat_fields("/proc/" + std::to_string(pid) + "/stat", &state, &start)) {
    // No /proc (or not readable): the signal-0 probe is all there is.
    if (::kill(pid, 0) == 0 || errno == EPERM) return "";
    return "exited";
  }
  // State from the process's entry (a zombie process), start time as process_start_time reads it.
  const uint64_t leader_start = process_start_time(pid);
  if (leader_start != 0) start = leader_start;
  if (start_time != 0 && start != start_time) return "exited (its pid now belongs to another process)";
  if (state == "Z" || state == "X" || state == "x") return "a zombie: it exited and was not reaped yet";
  return "";
}

SharedSegment SharedSegment::create(const std::string& name, size_t total_bytes) {
  const std::string path = "/" + name;
  const int fd = ::shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error(errno_text("cannot create", name));
  // posix_fallocate reserves the pages now: a full /dev/shm fails here, not as a SIGBUS on first touch.
  int rc = ::ftruncate(fd, static_cast<off_t>(total_bytes));
  if (rc == 0) rc = ::posix_fallocate(fd, 0, static_cast<off_t>(total_bytes));
  if (rc != 0) {
    if (rc > 0) errno = rc;
    const std::string msg = errno_text("cannot size (" + std::to_string(total_bytes) + " bytes)", name) +
                            "; free space in /dev/shm or ask for a smaller buffer";
    ::close(fd);
    ::shm_unlink(path.c_str());
    throw std::runtime_error(msg);
  }
  void* base = ::mmap(nullptr, total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) {
    const std::string msg = errno_text("cannot map", name);
    ::shm_unlink(path.c_str());
    throw std::runtime_error(msg);
  }
  return SharedSegment(name, static_cast<uint8_t*>(base), total_bytes);
}

SharedSegment SharedSegment::open(const std::string& name) {
  const std::string path = "/" + name;
  const int fd = ::shm_open(path.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    throw std::runtime_error(errno_text("cannot open", name) +
                             " (the creator closed it, or every end of it was opened already)");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(SegmentHeader))) {
    ::close(fd);
    throw std::runtime_error("shared-memory segment /dev/shm/" + name + " is too small to be a pagedcore segment");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) throw std::runtime_error(errno_text("cannot map", name));
  return SharedSegment(name, static_cast<uint8_t*>(base), size);
}

bool SharedSegment::unlink(const std::string& name) { return ::shm_unlink(("/" + name).c_str()) == 0; }

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : name_(std::move(other.name_)), base_(std::exchange(other.base_, nullptr)), size_(std::exchange(other.size_, 0)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    if (base_) ::munmap(base_, size_);
    name_ = std::move(other.name_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SharedSegment::~SharedSegment() {
  if (base_) ::munmap(base_, size_);
}

void SharedSegment::join(SegmentKind kind, uint32_t index) {
  SegmentHeader* h = header();
  if (h->magic.load(std::memory_order_acquire) != kSegmentMagic || h->kind != static_cast<uint32_t>(kind)) {
    throw std::runtime_error("/dev/shm/" + name_ + " is not a pagedcore " +
                             (kind == SegmentKind::kAllReduce ? "all-reduce group" : "channel"));
  }
  if (h->total_bytes != size_) throw std::runtime_error("/dev/shm/" + name_ + " has the wrong size for its header");
  if (index >= h->num_participants) {
    throw std::runtime_error("participant " + std::to_string(index) + " is outside /dev/shm/" + name_ + " (" +
                             std::to_string(h->num_participants) + " participants)");
  }
  ParticipantSlot& slot = participants()[index];
  uint32_t expected = kAbsent;
  if (!slot.state.compare_exchange_strong(expected, kOpen, std::memory_order_acq_rel)) {
    throw std::runtime_error("participant " + std::to_string(index) + " of /dev/shm/" + name_ +
                             " is already open (each rank / reader opens its end once)");
  }
  const int pid = static_cast<int>(::getpid());
  slot.start_time.store(process_start_time(pid), std::memory_order_relaxed);
  slot.pid.store(pid, std::memory_order_release);
  if (h->num_opened.fetch_add(1, std::memory_order_acq_rel) + 1 == h->num_participants) {
    SharedSegment::unlink(name_);  // every end is open: the name is no longer needed
  }
}

void SharedSegment::leave(uint32_t index) {
  if (base_ && index < header()->num_participants) {
    participants()[index].state.store(kClosed, std::memory_order_release);
    notify_waiters(futex());  // peers blocked on this participant see the close now, not at their next check
  }
}

}  // namespace distributed
}  // namespace pagedcore
