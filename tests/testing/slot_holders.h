// File: tests/testing/slot_holders.h
//
// SlotHolders: streams that each hold a KV slot for as long as the test
// wants. Each Generate stream runs on its own connection with a tiny HTTP/2
// receive window and no BDP probing, and is not read after its first delta,
// so the coordinator's writes stall and the request keeps its slot however
// fast the model is. The destructor cancels them all (the slots are then
// freed by the coordinator's close).
//
//   lede::testing::SlotHolders held;
//   ASSERT_TRUE(held.Open(cluster.coordinator_target(), 4));  // 4 slots busy
#ifndef LEDE_TESTS_TESTING_SLOT_HOLDERS_H_
#define LEDE_TESTS_TESTING_SLOT_HOLDERS_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "proto/lede/v1/generation.grpc.pb.h"

namespace lede::testing {

struct SlotHolders {
  struct Holder {
    std::unique_ptr<lede::v1::Generation::Stub> stub;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<lede::v1::GenerateResponse>> reader;
  };
  std::vector<std::unique_ptr<Holder>> holders;

  // A long sampled request (unlikely to end at EOS before the test is done).
  static lede::v1::GenerateRequest LongRequest() {
    lede::v1::GenerateRequest r;
    r.set_prompt("Once upon a time, there was a little dog named");
    r.set_max_new_tokens(256);
    r.set_method(lede::v1::SPECULATION_METHOD_AUTOREGRESSIVE);
    r.set_temperature(1.0f);
    r.set_top_p(1.0f);
    r.set_seed(7);
    return r;
  }

  // Opens `n` streams to `target`; true when each has its first delta.
  bool Open(const std::string& target, int n) {
    for (int i = 0; i < n; ++i) {
      auto h = std::make_unique<Holder>();
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
      args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 256);
      args.SetInt("lede.slot_holder", static_cast<int>(holders.size()));  // a connection each
      h->stub = lede::v1::Generation::NewStub(
          grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
      h->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      h->reader = h->stub->Generate(&h->ctx, LongRequest());
      lede::v1::GenerateResponse resp;
      if (!h->reader->Read(&resp) || !resp.has_delta()) return false;
      holders.push_back(std::move(h));
    }
    return true;
  }
  ~SlotHolders() {
    for (auto& h : holders) h->ctx.TryCancel();
  }
};

}  // namespace lede::testing

#endif  // LEDE_TESTS_TESTING_SLOT_HOLDERS_H_
