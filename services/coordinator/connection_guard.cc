#include "services/coordinator/connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "shared/rpc/server.h"

namespace lede::coordinator {
namespace {

struct Connection {
  int fd = -1;            // our dup() of the connection's socket
  std::string client;     // peer IP address
  absl::Time phase_since;  // accepted, or its last response written
  bool in_handler = false;
  bool shut = false;
  bool refused = false;   // over a cap: answered 503 and shut down at once
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

// The answer to a connection over a cap; written before the request is read.
void Refuse(int fd, const std::string& why) {
  const std::string body = R"({"error":{"message":")" + why + R"(","type":"server_error","param":null,"code":"too_many_connections"}})";
  const std::string response = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                               "Retry-After: 1\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)::send(fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_RDWR);
}

}  // namespace

struct ConnectionGuard::State {
  explicit State(ConnectionGuardOptions o) : options(std::move(o)) {}

  const ConnectionGuardOptions options;
  mutable absl::Mutex mu;
  int port ABSL_GUARDED_BY(mu) = -1;
  std::set<ino_t> known ABSL_GUARDED_BY(mu);  // sockets of open connections (inode)
  std::map<Connection*, std::unique_ptr<Connection>> open ABSL_GUARDED_BY(mu);
  std::map<std::string, int> per_client ABSL_GUARDED_BY(mu);  // not refused, by peer address
  int active ABSL_GUARDED_BY(mu) = 0;                           // open and not refused
  int64_t refused ABSL_GUARDED_BY(mu) = 0;
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

  // Registers the accepted connection (a refused one too, until the
  // library closes it); null when it could not be identified (then it runs
  // unguarded).
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
      Refuse(c->fd, active >= options.max_connections
                        ? "too many open connections (" + std::to_string(active) + "); retry"
                        : "too many open connections from " + c->client + " (" + std::to_string(from_client) +
                              "); retry");
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
    rpc::LogEvent("warn", "http_connections_cut",
                  {{"refused", std::to_string(refused - logged_refused)},
                   {"timed_out", std::to_string(timed_out - logged_timed_out)},
                   {"open", std::to_string(open.size())},
                   {"request_deadline_s", std::to_string(absl::ToInt64Seconds(options.request_deadline))}});
    logged_refused = refused;
    logged_timed_out = timed_out;
    last_log = now;
  }

  std::map<Connection*, ino_t> inodes ABSL_GUARDED_BY(mu);
};

namespace {

// Workers on demand: a connection starts on an idle worker, or on a new one
// while fewer than `max_threads` exist; else it waits its turn. A worker
// beyond the first `min_threads` that stays idle for `idle_timeout` exits,
// so a burst of connections does not keep its threads for the process's
// life.
class ElasticPool final : public httplib::TaskQueue {
 public:
  ElasticPool(std::shared_ptr<ConnectionGuard::State> state, int min_threads, int max_threads,
              absl::Duration idle_timeout)
      : state_(std::move(state)), min_threads_(min_threads), max_threads_(max_threads), idle_timeout_(idle_timeout) {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < min_threads; ++i) Spawn();
  }

  void enqueue(std::function<void()> fn) override {
    Connection* c = state_->Register();
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
      absl::MutexLock lock(&mu_);  // its release wakes a worker for the job
      jobs_.push_back(std::move(task));
      // Idle workers not yet woken count once: spawn while the jobs waiting
      // outnumber them.
      if (static_cast<int>(jobs_.size()) > idle_ && live_ < max_threads_) Spawn();
      exited.swap(exited_);
    }
    for (std::thread& t : exited) t.join();
  }

  void shutdown() override {
    std::map<int, std::thread> threads;
    std::vector<std::thread> exited;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      mu_.Await(absl::Condition(+[](int* live) { return *live == 0; }, &live_));
      threads.swap(threads_);
      exited.swap(exited_);
    }
    for (auto& [id, t] : threads) t.join();
    for (std::thread& t : exited) t.join();
  }

 private:
  void Spawn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int id = next_id_++;
    ++live_;
    threads_.emplace(id, std::thread([this, id] { Work(id); }));
    absl::MutexLock lock(&state_->mu);
    ++state_->threads;
    ++state_->threads_started;
  }

  void Work(int id) {
    for (;;) {
      std::function<void()> job;
      {
        absl::MutexLock lock(&mu_);
        ++idle_;
        const bool woken = mu_.AwaitWithTimeout(absl::Condition(this, &ElasticPool::HasWorkLocked), idle_timeout_);
        --idle_;
        if (jobs_.empty() && (stopping_ || (!woken && live_ > min_threads_))) {
          // Stopping, or idle too long beyond the pool's floor: exit. The
          // thread object moves to exited_ (joined by the next enqueue or
          // shutdown; the thread only returns after this).
          auto it = threads_.find(id);
          if (it != threads_.end()) {
            exited_.push_back(std::move(it->second));
            threads_.erase(it);
          }
          --live_;
          absl::MutexLock state_lock(&state_->mu);
          --state_->threads;
          return;
        }
        if (jobs_.empty()) continue;  // timed out at the floor: keep waiting
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !jobs_.empty(); }

  std::shared_ptr<ConnectionGuard::State> state_;
  const int min_threads_;
  const int max_threads_;
  const absl::Duration idle_timeout_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::thread> threads_ ABSL_GUARDED_BY(mu_);  // running workers, by id
  std::vector<std::thread> exited_ ABSL_GUARDED_BY(mu_);     // workers that returned, to join
  int next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int live_ ABSL_GUARDED_BY(mu_) = 0;  // workers running (threads_.size())
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
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
  s.timed_out = state_->timed_out;
  s.threads = state_->threads;
  s.threads_started = state_->threads_started;
  return s;
}

}  // namespace lede::coordinator
