// Tests of shared/rpc: the Status <-> grpc::Status conversion
// (grpc_status.h) and what ServerRunner and LogEvent promise (server.h):
// a server on a kernel-chosen port serving grpc.health.v1, refusing an
// address it cannot bind, shutting down cleanly on SIGTERM, and logfmt
// lines with quoting.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/completion_queue.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/lede/v1/policy.grpc.pb.h"
#include "shared/rpc/grpc_status.h"
#include "shared/rpc/server.h"
#include "tests/testing/child_process.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace lede::rpc {
namespace {

using ::lede::testing::ChildProcess;
using ::lede::testing::IsOk;
using ::lede::testing::StatusIs;
using ::testing::HasSubstr;

// A process that Serve()s blocks in WaitForTermination and, on SIGTERM,
// logs event=terminating, shuts down and returns OK (exit code 0 here).
// Runs in a forked child: SIGTERM must be blocked in every thread of the
// process that receives it, which only a fresh process can promise.
TEST(ServerRunnerTest, ServeStopsCleanlyOnSigterm) {
  lede::testing::TempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  auto child = ChildProcess::Fork(
      [] {
        BlockTerminationSignals();
        ServerRunner runner("rpc-test-child");
        ServerOptions options;
        options.metrics_address = "";
        options.shutdown_grace = absl::Milliseconds(100);
        return runner.Serve(options, nullptr).ok() ? 0 : 1;
      },
      (tmp.path() / "child.log").string());
  ASSERT_THAT(child, IsOk());
  ASSERT_THAT((*child)->WaitForStarted(std::chrono::seconds(30)), IsOk());
  EXPECT_GT((*child)->grpc_port(), 0);
  (*child)->Signal(SIGTERM);
  const std::optional<int> code = (*child)->Wait(std::chrono::seconds(30));
  ASSERT_TRUE(code.has_value()) << (*child)->Log();
  EXPECT_EQ(*code, 0) << (*child)->Log();
  const std::string log = (*child)->Log();
  EXPECT_THAT(log, HasSubstr("proc=rpc-test-child event=terminating signal=SIGTERM"));
  EXPECT_THAT(log, HasSubstr("event=stopped"));
}

// Every code maps to the gRPC code of the same value with the message kept,
// both ways; FromGrpcStatus prefixes the caller's `what`.
TEST(GrpcStatusTest, CodesAndMessagesMatchValueForValue) {
  EXPECT_TRUE(ToGrpcStatus(OkStatus()).ok());
  EXPECT_THAT(FromGrpcStatus(grpc::Status::OK, "verifier Verify"), IsOk());
  for (int c = 1; c <= 16; ++c) {
    const Status s(static_cast<StatusCode>(c), "message " + std::to_string(c));
    const grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(g.error_message(), "message " + std::to_string(c));
    const Status back = FromGrpcStatus(g);
    EXPECT_EQ(back.code(), s.code());
    EXPECT_EQ(back.message(), s.message());
    const Status prefixed = FromGrpcStatus(g, "verifier Verify");
    EXPECT_EQ(prefixed.code(), s.code());
    EXPECT_EQ(prefixed.message(), "verifier Verify: message " + std::to_string(c));
  }
}

// Calls grpc.health.v1.Health/Check for the whole server ("" service) with
// a generic stub; returns the call's status and the response bytes.
std::pair<grpc::Status, std::string> HealthCheck(int port) {
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::ByteBuffer request;  // HealthCheckRequest{service: ""} encodes to no bytes
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  std::string bytes;
  std::vector<grpc::Slice> slices;
  if (status.ok() && response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return {status, bytes};
}

// A runner on 127.0.0.1:0 serves on the port the kernel chose and answers
// health checks SERVING; after Shutdown() nothing answers.
TEST(ServerRunnerTest, ServesHealthOnTheChosenPort) {
  ServerRunner runner("rpc-test");
  ServerOptions options;
  options.metrics_address = "";
  options.shutdown_grace = absl::Milliseconds(100);
  ASSERT_THAT(runner.Start(options, nullptr), IsOk());
  ASSERT_GT(runner.port(), 0);
  EXPECT_EQ(runner.metrics_port(), 0);  // no metrics server was asked for
  auto [status, bytes] = HealthCheck(runner.port());
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // HealthCheckResponse{status: SERVING}
  const int port = runner.port();
  runner.Shutdown();
  runner.Shutdown();  // idempotent
  EXPECT_EQ(HealthCheck(port).first.error_code(), grpc::StatusCode::UNAVAILABLE);
}

// One reflection request (ServerReflectionRequest{list_services: ""}) on a
// bidi stream; the call's status and the response bytes.
std::pair<grpc::Status, std::string> ListServices(int port) {
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto next = [&cq] {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  std::string bytes;
  call->StartCall(reinterpret_cast<void*>(1));
  if (next()) {
    grpc::Slice list_services(std::string("\x3a\x00", 2));  // field 7 (list_services), empty
    call->Write(grpc::ByteBuffer(&list_services, 1), reinterpret_cast<void*>(2));
    if (next()) {
      call->WritesDone(reinterpret_cast<void*>(3));
      next();
      while (true) {
        grpc::ByteBuffer response;
        call->Read(&response, reinterpret_cast<void*>(4));
        if (!next()) break;
        std::vector<grpc::Slice> slices;
        if (response.Dump(&slices).ok()) {
          for (const grpc::Slice& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
        }
      }
    }
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  next();
  cq.Shutdown();
  while (next()) {
  }
  return {status, bytes};
}

// Reflection is on by default and off with ServerOptions::reflection =
// false, whatever other servers of the process asked for:
// libgrpc++_reflection registers its plugin for every server of the process
// as it loads, so "off" must take it away (docs/security.md: off on an
// internal service that authenticates callers). Health stays open on both.
TEST(ServerRunnerTest, ReflectionIsOffWhenTheOptionsSaySo) {
  ServerOptions options;
  options.metrics_address = "";
  options.shutdown_grace = absl::Milliseconds(100);
  // A service of the internal plane (every method UNIMPLEMENTED here), as the
  // policy service registers it.
  lede::v1::Policy::Service open_service, closed_service;
  ServerRunner open("rpc-test");
  open.AddService(&open_service);
  ASSERT_THAT(open.Start(options, nullptr), IsOk());
  auto [open_status, listing] = ListServices(open.port());
  ASSERT_TRUE(open_status.ok()) << open_status.error_message();
  EXPECT_THAT(listing, HasSubstr("grpc.health.v1.Health"));
  EXPECT_THAT(listing, HasSubstr("grpc.reflection.v1alpha.ServerReflection"));
  EXPECT_THAT(listing, HasSubstr("lede.v1.Policy"));

  options.reflection = false;
  ServerRunner closed("rpc-test");
  closed.AddService(&closed_service);
  ASSERT_THAT(closed.Start(options, nullptr), IsOk());
  auto [closed_status, closed_listing] = ListServices(closed.port());
  EXPECT_EQ(closed_status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << closed_status.error_message();
  EXPECT_EQ(closed_listing, "");
  EXPECT_TRUE(HealthCheck(closed.port()).first.ok());
  // The first server keeps its reflection.
  EXPECT_TRUE(ListServices(open.port()).first.ok());
}

// An address that cannot be served is kUnavailable, and nothing is left
// running.
TEST(ServerRunnerTest, UnservableAddressIsUnavailable) {
  ServerRunner runner("rpc-test");
  ServerOptions options;
  options.listen_address = "192.0.2.1:0";  // TEST-NET-1: no local interface has it
  options.metrics_address = "";
  EXPECT_THAT(runner.Start(options, nullptr), StatusIs(StatusCode::kUnavailable));
  EXPECT_EQ(runner.server(), nullptr);
}

// Captures what `fn` writes to stderr (fd 2).
template <typename Fn>
std::string CaptureStderr(Fn fn) {
  lede::testing::TempDir tmp;
  const std::string path = (tmp.path() / "stderr").string();
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// LogEvent writes one logfmt line: an RFC 3339 UTC timestamp, level,
// process, event, then the fields in order; values with spaces, quotes,
// '=', tabs or newlines (and empty ones) are quoted with \" and \n escapes.
TEST(LogEventTest, WritesOneQuotedLogfmtLine) {
  const std::string out = CaptureStderr([] {
    SetLogProcessName("rpc-test");
    LogEvent("warning", "policy_rejected",
             {{"plain", "v1"}, {"spaced", "a b"}, {"quoted", "say \"hi\""}, {"eq", "k=v"},
              {"empty", ""}, {"lines", "l1\nl2"}});
  });
  const std::regex line(
      R"(ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=warning proc=rpc-test event=policy_rejected )"
      R"(plain=v1 spaced="a b" quoted="say \\"hi\\"" eq="k=v" empty="" lines="l1\\nl2"\n)");
  EXPECT_TRUE(std::regex_match(out, line)) << out;
}

}  // namespace
}  // namespace lede::rpc
