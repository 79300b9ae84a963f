#include "dist/mpi/detail/allreduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "dist/detail/reduce_kernels.h"

namespace tandem::dist {

namespace {

constexpr size_t kMaxMessage = size_t(1) << 30;

// The algorithms' messages carry the allreduce's size in their tag, so a peer that runs an
// allreduce of another size on the group sends messages our receives do not match (instead of
// pieces of the same length that would sum silently), and foreign_message_waiting sees them.
// MPI guarantees tags up to 32767; two sizes 30,000 bytes apart apiece still collide.
int allreduce_tag(size_t bytes) { return 1000 + static_cast<int>(bytes % 30000); }

// Whether one of the `n` receives is still pending (without completing any: their statuses are
// read when all the requests complete).
bool receive_pending(const MPI_Request* recvs, int n) {
  for (int i = 0; i < n; ++i) {
    int done = 1;
    if (MPI_Request_get_status(recvs[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done) return true;
  }
  return false;
}

// A receive from `peer` (among the first `n` requests) is still pending and a message from it with
// another tag waits unmatched: the peer runs another collective. Its messages to us arrive in
// order, and it sends this collective's message for our pending receive before anything later;
// only our sends being pending proves nothing (the peer may be in its next collective already).
// Checked every 64th unsuccessful poll. MPI's runtime lock held.
void check_no_foreign_message(const CollectiveComm& c, const MPI_Request* recvs, int n, int peer, int tag) {
  if (!receive_pending(recvs, n)) return;
  int flag = 0;
  MPI_Status st;
  if (MPI_Iprobe(peer, MPI_ANY_TAG, c.comm(), &flag, &st) != MPI_SUCCESS || !flag || st.MPI_TAG == tag) return;
  int bytes = 0;
  MPI_Get_count(&st, MPI_BYTE, &bytes);
  throw MpiError(fmt::format("[mpi] allreduce: rank {} sent a message of another collective ({} bytes)", peer, bytes),
                 fmt::format("a message of another collective from rank {}", peer));
}

// The ring moves 2 (n-1)/n of the buffer in 2 (n-1) steps of bytes/n; recursive doubling moves
// all of it log2(n) times. The ring wins once its steps are past MPI's rendezvous size: from
// 64 KiB at n = 2, and with chunks of at least 32 KiB in larger groups.
constexpr size_t kRingMinBytes = 64 * 1024;
constexpr size_t kRingChunkBytes = 32 * 1024;
bool use_ring(size_t bytes, int n) { return bytes >= std::max(kRingMinBytes, kRingChunkBytes * static_cast<size_t>(n)); }

// The receives among `reqs` (the first ones, `expected` bytes each) got what was expected: a peer
// that ran another collective on the group sends a message of another size, which MPI accepts when
// it is shorter (a longer one is MPI's own error). Throws an MpiError, which the group turns into
// an error naming both collectives.
void check_received(const MPI_Status* statuses, const int* expected, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    int got = 0;
    MPI_Get_count(&statuses[i], MPI_BYTE, &got);
    if (got != expected[i])
      throw MpiError(fmt::format("[mpi] allreduce: a peer sent {} bytes where {} were expected", got, expected[i]),
                     fmt::format("a message of {} bytes where {} were expected", got, expected[i]));
  }
}

}  // namespace

bool wait_requests(MPI_Request* reqs, int n, Clock::time_point deadline, size_t bytes) {
  return poll_until(deadline, bytes, [&] {
    int done = 0;
    auto lk = mpi_runtime().lock();
    TANDEM_MPI_CHECK(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    return done != 0;
  });
}

void reduce_local(char* acc, const char* src, int64_t count, Dtype dt, ReduceOp r) {
  TANDEM_DISPATCH_ALL(dt, "allreduce", [&] {
    detail::reduce_into(reinterpret_cast<scalar_t*>(acc), reinterpret_cast<const scalar_t*>(src), count, r);
  });
}

void divide_buffer(void* p, int64_t n, Dtype dt, int divisor) {
  TANDEM_DISPATCH_FLOATING(dt, "allreduce", [&] { detail::divide_by(static_cast<scalar_t*>(p), n, divisor); });
}

std::unique_ptr<StartedOp> start_allreduce(CollectiveComm& c, char* data, int64_t count, Dtype dt, ReduceOp reduce) {
  if (c.size() > 1 && count >= c.size() && use_ring(count * itemsize(dt), c.size()))
    return std::make_unique<RingAllreduce>(c, reduce, data, count, dt);
  return std::make_unique<SmallAllreduce>(c, reduce, data, count, dt);
}

bool allreduce_buffer(CollectiveComm& c, char* data, int64_t count, Dtype dt, ReduceOp reduce, Clock::time_point deadline) {
  const int n = c.size();
  if (n == 1 || count == 0) return true;
  if (count < n || !use_ring(count * itemsize(dt), n)) {
    SmallAllreduce small(c, reduce, data, count, dt);
    return poll_until(deadline, 0, [&] { return small.progress(); });
  }
  RingAllreduce ring(c, reduce, data, count, dt);
  // A fresh Backoff for every step, whose patience is for that step's transfer: one Backoff over
  // the whole ring would sleep between the polls of every step after the first millisecond.
  const size_t step_bytes = 2 * static_cast<size_t>(count / n + 1) * itemsize(dt);
  int step = ring.step();
  Backoff backoff(step_bytes);
  for (uint64_t spin = 0;; ++spin) {
    if (ring.progress()) return true;
    if (ring.step() != step) {
      step = ring.step();
      backoff = Backoff(step_bytes);
    }
    if ((spin & 63) == 63 && (Clock::now() > deadline || wait_abandoned())) return false;
    backoff.pause();
  }
}

// ---- RingAllreduce ----

RingAllreduce::RingAllreduce(CollectiveComm& c, ReduceOp reduce, char* data, int64_t count, Dtype dt)
    : c_(c), reduce_(reduce), data_(data), count_(count), dt_(dt), item_(itemsize(dt)),
      tag_(allreduce_tag(static_cast<size_t>(count) * itemsize(dt))) {
  tmp_ = c.scratch(1, static_cast<size_t>(count / c.size() + 1) * item_);
  post_step();
}

RingAllreduce::~RingAllreduce() {
  // Only after a failure: free what is still posted (the group is broken by then).
  auto lk = mpi_runtime().lock();
  for (MPI_Request& r : reqs_)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
}

// Step s < n-1 of the reduce-scatter sends chunk (r - s) and receives chunk (r - s - 1) into the
// scratch, to be added to ours; step s of the allgather sends the finished chunk (r + 1 - s) and
// receives chunk (r - s) in place.
void RingAllreduce::chunks(int& send, int& recv) const {
  const int n = c_.size(), r = c_.rank();
  const int s = step_ < n - 1 ? step_ : step_ - (n - 1);
  const int shift = step_ < n - 1 ? 0 : 1;
  send = ((r + shift - s) % n + n) % n;
  recv = ((r + shift - s - 1) % n + n) % n;
}

void RingAllreduce::post_step() {
  const int n = c_.size(), r = c_.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  int send_c = 0, recv_c = 0;
  chunks(send_c, recv_c);
  const bool reducing = step_ < n - 1;
  const char* send = data_ + lo(send_c) * item_;
  char* recv = reducing ? tmp_ : data_ + lo(recv_c) * item_;
  const size_t send_bytes = static_cast<size_t>(len(send_c)) * item_;
  const size_t recv_bytes = static_cast<size_t>(len(recv_c)) * item_;
  reqs_.clear();
  recv_bytes_.clear();
  auto lk = mpi_runtime().lock();
  // In pieces that fit an int count.
  for (size_t off = 0; off < recv_bytes; off += kMaxMessage) {
    reqs_.push_back(MPI_REQUEST_NULL);
    const int piece = static_cast<int>(std::min(kMaxMessage, recv_bytes - off));
    recv_bytes_.push_back(piece);
    TANDEM_MPI_CHECK(MPI_Irecv(recv + off, piece, MPI_BYTE, left, tag_, c_.comm(), &reqs_.back()));
  }
  for (size_t off = 0; off < send_bytes; off += kMaxMessage) {
    reqs_.push_back(MPI_REQUEST_NULL);
    const int piece = static_cast<int>(std::min(kMaxMessage, send_bytes - off));
    TANDEM_MPI_CHECK(MPI_Isend(send + off, piece, MPI_BYTE, right, tag_, c_.comm(), &reqs_.back()));
  }
}

bool RingAllreduce::progress() {
  if (done_) return true;
  if (!reqs_.empty()) {
    int flag = 0;
    statuses_.resize(reqs_.size());
    auto lk = mpi_runtime().lock();
    TANDEM_MPI_CHECK(MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, statuses_.data()));
    if (!flag) {
      if ((++polls_ & 63) == 0)
        check_no_foreign_message(c_, reqs_.data(), static_cast<int>(recv_bytes_.size()),
                                 (c_.rank() + c_.size() - 1) % c_.size(), tag_);
      return false;
    }
    check_received(statuses_.data(), recv_bytes_.data(), recv_bytes_.size());
  }
  const int n = c_.size();
  if (step_ < n - 1) {
    int send_c = 0, recv_c = 0;
    chunks(send_c, recv_c);
    reduce_local(data_ + lo(recv_c) * item_, tmp_, len(recv_c), dt_, reduce_);
  }
  if (++step_ < 2 * (n - 1)) {
    post_step();
    return false;
  }
  reqs_.clear();
  if (reduce_ == ReduceOp::avg) divide_buffer(data_, count_, dt_, n);
  done_ = true;
  return true;
}

SmallAllreduce::SmallAllreduce(CollectiveComm& c, ReduceOp reduce, char* data, int64_t count, Dtype dt)
    : c_(c), reduce_(reduce), data_(data), count_(count), dt_(dt), bytes_(count * itemsize(dt)),
      tag_(allreduce_tag(bytes_)) {
  const int n = c.size();
  if (n == 1 || count == 0) {
    done_ = true;
  } else if ((n & (n - 1)) == 0) {
    tmp_ = c.scratch(1, bytes_);
    post_round();
  } else {
    auto lk = mpi_runtime().lock();
    TANDEM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data_, mpi_int(count_, "allreduce count"), mpi_type(dt_),
                                    mpi_op(reduce_, dt_), c.comm(), &reqs_[0]));
    nreq_ = 1;
  }
}

SmallAllreduce::~SmallAllreduce() {
  // Only after a failure: free what is still posted (the group is broken by then).
  auto lk = mpi_runtime().lock();
  for (int i = 0; i < nreq_; ++i)
    if (reqs_[i] != MPI_REQUEST_NULL) MPI_Request_free(&reqs_[i]);
}

bool SmallAllreduce::progress() {
  if (done_) return true;
  int flag = 0;
  {
    auto lk = mpi_runtime().lock();
    TANDEM_MPI_CHECK(MPI_Testall(nreq_, reqs_, &flag, statuses_));
    if (!flag) {  // MPI's own allreduce (no tmp_) checks its messages itself
      if (tmp_ && (++polls_ & 63) == 0) check_no_foreign_message(c_, reqs_, nrecv_, c_.rank() ^ mask_, tag_);
      return false;
    }
    if (tmp_) check_received(statuses_, recv_bytes_, static_cast<size_t>(nrecv_));
  }
  nreq_ = 0;
  if (tmp_) {
    const int peer = c_.rank() ^ mask_;
    if (c_.rank() < peer) {
      reduce_local(data_, tmp_, count_, dt_, reduce_);
    } else {
      reduce_local(tmp_, data_, count_, dt_, reduce_);
      std::memcpy(data_, tmp_, bytes_);
    }
    mask_ <<= 1;
    if (mask_ < c_.size()) {
      post_round();
      return false;
    }
  }
  if (reduce_ == ReduceOp::avg) divide_buffer(data_, count_, dt_, c_.size());
  done_ = true;
  return true;
}

// Posts the exchange with rank ^ mask_, in pieces that fit MPI's eager protocol: Open MPI's
// shared-memory transport sends at most 4 KiB (header included) eagerly and a larger message
// costs a rendezvous round trip, which for a small allreduce costs more than the pieces' extra
// messages.
void SmallAllreduce::post_round() {
  const int peer = c_.rank() ^ mask_;
  const size_t item = itemsize(dt_);
  const size_t piece = bytes_ <= kPieceBytes * kMaxPieces ? kPieceBytes / item * item : bytes_;
  nrecv_ = 0;
  auto lk = mpi_runtime().lock();
  for (size_t off = 0; off < bytes_; off += piece) {
    int len = static_cast<int>(std::min(piece, bytes_ - off));
    recv_bytes_[nrecv_++] = len;
    TANDEM_MPI_CHECK(MPI_Irecv(tmp_ + off, len, MPI_BYTE, peer, tag_, c_.comm(), &reqs_[nreq_++]));
  }
  for (size_t off = 0; off < bytes_; off += piece) {
    int len = static_cast<int>(std::min(piece, bytes_ - off));
    TANDEM_MPI_CHECK(MPI_Isend(data_ + off, len, MPI_BYTE, peer, tag_, c_.comm(), &reqs_[nreq_++]));
  }
}

}  // namespace tandem::dist
