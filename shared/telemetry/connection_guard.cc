#include "shared/telemetry/connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <list>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "shared/log/log.h"

namespace lede::telemetry {
namespace {

struct Connection {
  int fd = -1;             // our dup() of the connection's socket
  std::string client;      // peer IP address
  absl::Time phase_since;  // accepted, or its last response written
  bool in_handler = false;
  bool shut = false;
  bool refused = false;    // over a cap: in triage, never on a worker
  std::string reason;      // why it was refused
};

thread_local Connection* tl_connection = nullptr;
thread_local ConnectionGuard::State* tl_state = nullptr;

// The IP address of a socket's peer, "" when it has none (a listener).
std::string PeerAddress(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "";
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    if (inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&a)->sin_addr, buf, sizeof(buf)) == nullptr) return "";
  } else if (a.ss_family == AF_INET6) {
    if (inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr, buf, sizeof(buf)) == nullptr) {
      return "";
    }
  } else {
    return "";
  }
  return buf;
}

int LocalPort(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  return -1;
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return status < 400 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

// The bytes of `r` as an HTTP/1.1 response that closes the connection; no
// body for HEAD (Content-Length still that of the body).
std::string Serialize(const GuardResponse& r, bool head) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + ReasonPhrase(r.status) +
                    "\r\nContent-Type: " + r.content_type + "\r\nContent-Length: " + std::to_string(r.body.size()) +
                    "\r\nConnection: close\r\n";
  if (r.retry_after_s > 0) out += "Retry-After: " + std::to_string(r.retry_after_s) + "\r\n";
  out += "\r\n";
  if (!head) out += r.body;
  return out;
}

// Method and path (target without its query) of a complete request head,
// or {"", ""} when its first line is not an HTTP request line.
std::pair<std::string, std::string> RequestLine(const std::string& head) {
  const size_t eol = head.find("\r\n");
  if (eol == std::string::npos) return {"", ""};
  const std::string line = head.substr(0, eol);
  const size_t a = line.find(' ');
  const size_t b = a == std::string::npos ? a : line.find(' ', a + 1);
  if (a == std::string::npos || b == std::string::npos || line.compare(b + 1, 5, "HTTP/") != 0) return {"", ""};
  std::string target = line.substr(a + 1, b - a - 1);
  const size_t q = target.find('?');
  if (q != std::string::npos) target.resize(q);
  return {line.substr(0, a), target};
}

}  // namespace

GuardResponse TooManyConnections(const std::string& reason) {
  GuardResponse r;
  std::string message;
  for (char c : reason) {  // the reason is ours, but keep the JSON valid whatever it holds
    if (c == '"' || c == '\\') message += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) message += c;
  }
  r.body = R"({"error":{"message":")" + message +
           R"(","type":"server_error","param":null,"code":"too_many_connections"}})";
  return r;
}

struct ConnectionGuard::State {
  explicit State(ConnectionGuardOptions o) : options(std::move(o)) {}

  const ConnectionGuardOptions options;
  mutable absl::Mutex mu;
  int port ABSL_GUARDED_BY(mu) = -1;
  std::set<ino_t> known ABSL_GUARDED_BY(mu);  // sockets of open connections (inode)
  std::map<Connection*, std::unique_ptr<Connection>> open ABSL_GUARDED_BY(mu);
  std::map<Connection*, ino_t> inodes ABSL_GUARDED_BY(mu);
  std::map<std::string, int> per_client ABSL_GUARDED_BY(mu);  // not refused, by peer address
  int active ABSL_GUARDED_BY(mu) = 0;                           // open and not refused
  int64_t refused ABSL_GUARDED_BY(mu) = 0;
  int64_t triaged_answered ABSL_GUARDED_BY(mu) = 0;
  int64_t timed_out ABSL_GUARDED_BY(mu) = 0;
  int64_t threads ABSL_GUARDED_BY(mu) = 0;          // workers running now
  int64_t threads_started ABSL_GUARDED_BY(mu) = 0;  // workers ever started
  int64_t logged_refused ABSL_GUARDED_BY(mu) = 0, logged_timed_out ABSL_GUARDED_BY(mu) = 0;
  absl::Time last_log ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  bool stopping ABSL_GUARDED_BY(mu) = false;

  // The socket the listener just accepted: the one on our port whose inode
  // is not known yet. Returns its descriptor (the library's), or -1.
  int FindNewConnection(ino_t* inode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    DIR* dir = ::opendir("/proc/self/fd");
    if (dir == nullptr) return -1;
    int found = -1;
    const int dir_fd = ::dirfd(dir);
    while (dirent* e = ::readdir(dir)) {
      const int fd = std::atoi(e->d_name);
      if (fd <= 2 || fd == dir_fd) continue;
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode) || known.count(st.st_ino) > 0) continue;
      if (LocalPort(fd) != port || PeerAddress(fd).empty()) continue;
      if (found < 0 || fd > found) {  // (one new socket per accept; the newest if ever two)
        found = fd;
        *inode = st.st_ino;
      }
    }
    ::closedir(dir);
    return found;
  }

  // Registers the accepted connection; one over a cap is marked refused
  // (with its reason) for the triage thread. Null when it could not be
  // identified (then it runs unguarded).
  Connection* Register() {
    absl::MutexLock lock(&mu);
    ino_t inode = 0;
    const int fd = FindNewConnection(&inode);
    if (fd < 0) return nullptr;
    auto c = std::make_unique<Connection>();
    c->client = PeerAddress(fd);
    c->fd = ::dup(fd);
    if (c->fd < 0) return nullptr;
    c->phase_since = absl::Now();
    const int from_client = per_client.count(c->client) > 0 ? per_client[c->client] : 0;
    if (active >= options.max_connections || from_client >= options.max_connections_per_client) {
      ++refused;
      c->reason = active >= options.max_connections
                      ? "too many open connections (" + std::to_string(active) + "); retry"
                      : "too many open connections from " + c->client + " (" + std::to_string(from_client) +
                            "); retry";
      c->refused = c->shut = true;
      MaybeLog();
    } else {
      ++active;
      ++per_client[c->client];
    }
    known.insert(inode);
    inodes[c.get()] = inode;
    Connection* raw = c.get();
    open[raw] = std::move(c);
    return raw;
  }

  void Unregister(Connection* c) {
    absl::MutexLock lock(&mu);
    auto it = open.find(c);
    if (it == open.end()) return;
    ::close(c->fd);
    known.erase(inodes[c]);
    inodes.erase(c);
    if (!c->refused) {
      --active;
      if (--per_client[c->client] <= 0) per_client.erase(c->client);
    }
    open.erase(it);
  }

  // Shuts down the connections past their deadline (or every idle one).
  // Connections in triage are the triage thread's.
  void Sweep(bool all_idle) {
    absl::MutexLock lock(&mu);
    const absl::Time now = absl::Now();
    for (auto& [raw, c] : open) {
      if (c->in_handler || c->shut) continue;
      if (!all_idle && now - c->phase_since < options.request_deadline) continue;
      ::shutdown(c->fd, SHUT_RDWR);
      c->shut = true;
      if (!all_idle) ++timed_out;
    }
    MaybeLog();
  }

  // At most one log line per 10 s about refusals and deadlines.
  void MaybeLog() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (refused == logged_refused && timed_out == logged_timed_out) return;
    const absl::Time now = absl::Now();
    if (now - last_log < absl::Seconds(10)) return;
    logging::LogEvent("warn", "http_connections_cut",
                      {{"server", options.name},
                       {"over_capacity", std::to_string(refused - logged_refused)},
                       {"timed_out", std::to_string(timed_out - logged_timed_out)},
                       {"open", std::to_string(active)},
                       {"request_deadline_ms", std::to_string(absl::ToInt64Milliseconds(options.request_deadline))}});
    logged_refused = refused;
    logged_timed_out = timed_out;
    last_log = now;
  }
};

namespace {

// The connections over a cap, served by one thread with poll(): read the
// request head (until triage_deadline), write options.over_capacity's
// answer, half-close, drain what the client still sends, close. No client
// can hold the thread: every step is non-blocking and has a deadline.
class Triage {
 public:
  explicit Triage(std::shared_ptr<ConnectionGuard::State> state) : state_(std::move(state)) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    thread_ = std::thread([this] { Loop(); });
  }

  // Takes over a refused connection; `close_task` is the library's task for
  // its socket, run once the socket is shut down (it then closes it).
  void Add(Connection* c, std::function<void()> close_task) {
    const ConnectionGuardOptions& o = state_->options;
    {
      absl::MutexLock lock(&mu_);
      if (!stopping_ && o.plaintext && pending_ < o.max_triage_connections) {
        ++pending_;
        incoming_.emplace_back(c, std::move(close_task), absl::Now() + o.triage_deadline);
        const uint64_t one = 1;
        (void)!::write(wake_fd_, &one, sizeof(one));
        return;
      }
    }
    // Too many in triage (or TLS, or stopping): answer without reading, best effort.
    if (o.plaintext) {
      const std::string out = Serialize(Answer("", "", c->reason), false);
      (void)::send(c->fd, out.data(), out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    Item item(c, std::move(close_task), absl::Now());
    Finish(item);
  }

  ~Triage() { Stop(); }

  // Finishes every connection in triage (closing them) and joins the thread.
  // Idempotent.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      const uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof(one));
    }
    if (thread_.joinable()) thread_.join();
    if (wake_fd_ >= 0) ::close(wake_fd_);
    wake_fd_ = -1;
  }

 private:
  enum class Phase { kReading, kWriting, kDraining };
  struct Item {
    Item(Connection* conn, std::function<void()> task, absl::Time until)
        : c(conn), close_task(std::move(task)), deadline(until) {}
    Connection* c;
    std::function<void()> close_task;
    absl::Time deadline;
    Phase phase = Phase::kReading;
    std::string in;
    std::string out;
    size_t sent = 0;
  };
  static constexpr size_t kMaxHead = 16 << 10;

  GuardResponse Answer(const std::string& method, const std::string& path, const std::string& reason) {
    const OverCapacityHandler& h = state_->options.over_capacity;
    return h ? h(method, path, reason) : TooManyConnections(reason);
  }

  void Finish(Item& item) {
    ::shutdown(item.c->fd, SHUT_RDWR);
    if (item.close_task) item.close_task();  // reads EOF at once, closes the library's descriptor
    state_->Unregister(item.c);
  }

  void Respond(Item& item, bool head_complete, absl::Time now) {
    std::pair<std::string, std::string> line{"", ""};
    if (head_complete) line = RequestLine(item.in);
    item.out = Serialize(Answer(line.first, line.second, item.c->reason), line.first == "HEAD");
    item.phase = Phase::kWriting;
    item.deadline = now + state_->options.triage_deadline;
    absl::MutexLock lock(&state_->mu);
    ++state_->triaged_answered;
  }

  // Advances one connection; true when it is finished.
  bool Step(Item& item, short revents, absl::Time now) {
    char buf[4096];
    if (item.phase == Phase::kReading) {
      bool eof = false;
      if ((revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        for (;;) {
          const ssize_t n = ::recv(item.c->fd, buf, sizeof(buf), MSG_DONTWAIT);
          if (n > 0) {
            item.in.append(buf, static_cast<size_t>(n));
            if (item.in.size() >= kMaxHead) break;
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          if (n < 0 || item.in.empty()) return true;  // broken, or gone before a byte
          eof = true;  // sent its request and half-closed: still answered
          break;
        }
      }
      const bool complete = item.in.find("\r\n\r\n") != std::string::npos;
      if (complete || eof || item.in.size() >= kMaxHead || now >= item.deadline) Respond(item, complete, now);
    }
    if (item.phase == Phase::kWriting) {
      while (item.sent < item.out.size()) {
        const ssize_t n = ::send(item.c->fd, item.out.data() + item.sent, item.out.size() - item.sent,
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
          item.sent += static_cast<size_t>(n);
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        return true;  // broken
      }
      if (item.sent < item.out.size()) return now >= item.deadline;
      // Half-close, then read until the client closes: closing with its
      // unread bytes in our buffer would send it a reset instead.
      ::shutdown(item.c->fd, SHUT_WR);
      item.phase = Phase::kDraining;
      item.deadline = now + state_->options.triage_deadline;
      return false;
    }
    if (item.phase == Phase::kDraining) {
      for (;;) {
        const ssize_t n = ::recv(item.c->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) continue;
        if (n == 0) return true;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return true;
        break;
      }
      return now >= item.deadline;
    }
    return false;
  }

  void Loop() {
    std::list<Item> items;
    std::vector<pollfd> fds;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        while (!incoming_.empty()) {
          items.push_back(std::move(incoming_.front()));
          incoming_.pop_front();
        }
        if (stopping_) break;
      }
      const absl::Time now = absl::Now();
      absl::Duration wait = absl::Milliseconds(200);
      fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
      for (const Item& item : items) {
        fds.push_back(pollfd{item.c->fd, static_cast<short>(item.phase == Phase::kWriting ? POLLOUT : POLLIN), 0});
        wait = std::min(wait, std::max(absl::ZeroDuration(), item.deadline - now));
      }
      const int timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(wait + absl::Milliseconds(1) -
                                                                        absl::Nanoseconds(1)));
      (void)::poll(fds.data(), fds.size(), timeout_ms);
      if ((fds[0].revents & POLLIN) != 0) {
        uint64_t v = 0;
        (void)!::read(wake_fd_, &v, sizeof(v));
      }
      const absl::Time after = absl::Now();
      size_t i = 1;
      for (auto it = items.begin(); it != items.end(); ++i) {
        if (Step(*it, fds[i].revents, after)) {
          Finish(*it);
          it = items.erase(it);
          absl::MutexLock lock(&mu_);
          --pending_;
        } else {
          ++it;
        }
      }
    }
    for (Item& item : items) Finish(item);
  }

  std::shared_ptr<ConnectionGuard::State> state_;
  int wake_fd_ = -1;
  absl::Mutex mu_;
  std::deque<Item> incoming_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // in incoming_ or in the loop
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Workers on demand: a connection goes to the most recently idle worker, or
// to a new one while fewer than `max_threads` exist; else it waits its turn.
// A worker beyond the first `min_threads` that gets no connection for
// `idle_timeout` exits; since idle workers are reused last-in first-out, the
// ones a trickle of traffic does not need time out, so a burst of
// connections does not keep its threads for the process's life.
class ElasticPool final : public httplib::TaskQueue {
 public:
  ElasticPool(std::shared_ptr<ConnectionGuard::State> state, int min_threads, int max_threads,
              absl::Duration idle_timeout)
      : state_(std::move(state)),
        triage_(state_),
        min_threads_(min_threads),
        max_threads_(max_threads),
        idle_timeout_(idle_timeout) {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < min_threads; ++i) Spawn(nullptr);
  }

  void enqueue(std::function<void()> fn) override {
    Connection* c = state_->Register();
    if (c != nullptr && c->refused) {
      triage_.Add(c, std::move(fn));
      return;
    }
    std::shared_ptr<ConnectionGuard::State> state = state_;
    auto task = [state, c, fn = std::move(fn)] {
      tl_connection = c;
      tl_state = state.get();
      fn();
      tl_connection = nullptr;
      tl_state = nullptr;
      if (c != nullptr) state->Unregister(c);
    };
    std::vector<std::thread> exited;
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        Worker* w = idle_.back();  // the most recently idle: the others may time out
        idle_.pop_back();
        w->job = std::move(task);
        w->has_job = true;
      } else if (live_ < max_threads_) {
        Spawn(std::move(task));
      } else {
        queued_.push_back(std::move(task));
      }
      exited.swap(exited_);
    }
    for (std::thread& t : exited) t.join();
  }

  void shutdown() override {
    triage_.Stop();
    std::map<Worker*, std::unique_ptr<Worker>> workers;
    std::vector<std::thread> exited;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      mu_.Await(absl::Condition(+[](int* live) { return *live == 0; }, &live_));
      workers.swap(workers_);
      exited.swap(exited_);
    }
    for (auto& [w, owned] : workers) {
      if (owned->thread.joinable()) owned->thread.join();
    }
    for (std::thread& t : exited) t.join();
  }

 private:
  struct Worker {
    std::function<void()> job;
    bool has_job = false;
    std::thread thread;
  };

  void Spawn(std::function<void()> first_job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto w = std::make_unique<Worker>();
    Worker* raw = w.get();
    raw->job = std::move(first_job);
    raw->has_job = static_cast<bool>(raw->job);
    ++live_;
    workers_.emplace(raw, std::move(w));
    raw->thread = std::thread([this, raw] { Work(raw); });
    absl::MutexLock lock(&state_->mu);
    ++state_->threads;
    ++state_->threads_started;
  }

  void Work(Worker* w) {
    mu_.Lock();
    for (;;) {
      if (w->has_job) {
        std::function<void()> job = std::move(w->job);
        w->job = nullptr;
        w->has_job = false;
        mu_.Unlock();
        job();
        mu_.Lock();
        continue;
      }
      if (!queued_.empty()) {
        w->job = std::move(queued_.front());
        queued_.pop_front();
        w->has_job = true;
        continue;
      }
      if (stopping_) break;
      idle_.push_back(w);
      const absl::Time deadline = absl::Now() + idle_timeout_;
      const auto ready = [this, w]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->has_job || stopping_; };
      const bool woken = mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
      if (w->has_job) continue;  // handed a job (no longer in idle_)
      idle_.erase(std::find(idle_.begin(), idle_.end(), w));
      if (!woken && !stopping_ && live_ <= min_threads_) continue;  // at the floor: stay
      break;  // stopping, or idle too long beyond the floor
    }
    // Exit: the thread object moves to exited_ (joined by the next enqueue or
    // shutdown; the thread only returns after this).
    auto it = workers_.find(w);
    if (it != workers_.end()) {
      exited_.push_back(std::move(it->second->thread));
      workers_.erase(it);
    }
    --live_;
    {
      absl::MutexLock state_lock(&state_->mu);
      --state_->threads;
    }
    mu_.Unlock();
  }

  std::shared_ptr<ConnectionGuard::State> state_;
  Triage triage_;
  const int min_threads_;
  const int max_threads_;
  const absl::Duration idle_timeout_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queued_ ABSL_GUARDED_BY(mu_);   // waiting for a worker
  std::vector<Worker*> idle_ ABSL_GUARDED_BY(mu_);                 // back = most recently idle
  std::map<Worker*, std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);  // running workers
  std::vector<std::thread> exited_ ABSL_GUARDED_BY(mu_);           // workers that returned, to join
  int live_ ABSL_GUARDED_BY(mu_) = 0;                               // workers running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

ConnectionGuard::ConnectionGuard(ConnectionGuardOptions options)
    : options_(options), state_(std::make_shared<State>(options)) {
  std::shared_ptr<State> state = state_;
  watchdog_ = std::thread([state] {
    absl::MutexLock lock(&state->mu);
    while (!state->stopping) {
      state->mu.AwaitWithTimeout(absl::Condition(&state->stopping), state->options.tick);
      if (state->stopping) break;
      state->mu.Unlock();
      state->Sweep(/*all_idle=*/false);
      state->mu.Lock();
    }
  });
}

ConnectionGuard::~ConnectionGuard() {
  {
    absl::MutexLock lock(&state_->mu);
    state_->stopping = true;
  }
  watchdog_.join();
}

void ConnectionGuard::set_port(int port) {
  absl::MutexLock lock(&state_->mu);
  state_->port = port;
}

httplib::TaskQueue* ConnectionGuard::NewTaskQueue() {
  return new ElasticPool(state_, options_.min_threads, options_.max_connections + 1, options_.idle_worker_timeout);
}

void ConnectionGuard::ShutdownIdle() { state_->Sweep(/*all_idle=*/true); }

void ConnectionGuard::HandlerStarted() {
  if (tl_connection == nullptr || tl_state == nullptr) return;
  absl::MutexLock lock(&tl_state->mu);
  tl_connection->in_handler = true;
}

void ConnectionGuard::ResponseDone() {
  if (tl_connection == nullptr || tl_state == nullptr) return;
  absl::MutexLock lock(&tl_state->mu);
  tl_connection->in_handler = false;
  tl_connection->phase_since = absl::Now();
}

ConnectionGuard::Stats ConnectionGuard::stats() const {
  absl::MutexLock lock(&state_->mu);
  Stats s;
  s.open = state_->active;
  s.refused = state_->refused;
  s.triaged_answered = state_->triaged_answered;
  s.timed_out = state_->timed_out;
  s.threads = state_->threads;
  s.threads_started = state_->threads_started;
  return s;
}

}  // namespace lede::telemetry
