// CUDA kernels of mp::lstm_layer_library: cuDNN 9's RNN API (cudnnRNNForward with a reserve space,
// cudnnRNNBackwardData_v8, cudnnRNNBackwardWeights_v8), one unidirectional LSTM layer with PyTorch's two
// biases. Contract: src/backend/rnn_library_kernels.hpp; Note [library LSTM] in src/ops/rnn_library.cpp.
// UNVERIFIED ON A GPU when written (compiled only); tests/cuda/test_cuda_lstm_library.cpp checks it.
//
// Note [cuDNN LSTM weights]
// cuDNN keeps all parameters in one opaque "weight space". cudnnGetRNNWeightParams reports, per
// linLayerID, where each matrix and bias lives: IDs 0-3 are the input-side matrices W_i, W_f, W_c, W_o
// (with the input biases b_W*), IDs 4-7 the recurrent R_i, R_f, R_c, R_o (with b_R*), each matrix
// [H, in] row-major. The cell equations of cudnnRNNMode_t's CUDNN_LSTM (i, f, o sigmoid, c' = tanh,
// c = f c + i c', h = o tanh(c)) with that ID order are PyTorch's gate order i, f, g, o, and PyTorch's
// w_ih [4H, I] is the four W matrices stacked: aten/src/ATen/native/cudnn/RNN.cpp (get_parameters and
// _copyParams) copies/view its weight_ih, weight_hh, bias_ih, bias_hh straight into linLayerIDs 0-3 /
// 4-7 with no permutation, and checks the four matrices are consecutive. Checked while writing this with
// the `search` tool: the cuDNN API text reproduced by managedCuda's cudnnRNNMode docs (equations and
// gate names) and PyTorch's RNN.cpp (pytorch/pytorch, get_parameters). Here the reported descriptors are
// checked to be [1, H, in] with row-major strides before anything is copied, and the copies are
// planned once per shape from the reported offsets (adjacent pieces merged: one cudaMemcpyAsync per
// tensor when cuDNN packs them like PyTorch). The weight space is a fresh device buffer per call (our
// four tensors are copied in, the gradients copied out of a zeroed gradient space, WGRAD_MODE_ADD).
//
// Note [cuDNN LSTM precision]
// f32: data and math FLOAT, CUDNN_FMA_MATH (exact f32 products) unless float32_matmul_precision() is
// `high`, then CUDNN_DEFAULT_MATH, which lets cuDNN use TF32 on sm_80+ (the same rule as conv.cu; note
// that DEFAULT_MATH alone would already allow TF32). f16 / bf16: data type of the input, math precision
// FLOAT, CUDNN_TENSOR_OP_MATH (what PyTorch's promote_rnn_math_type does). cuDNN RNNs accept bf16 since
// cuDNN 9.13 (pytorch/pytorch#164411 enables cuDNN bf16 RNNs from that version); older libraries are
// refused with a clear message. The states h and c have the data type (cuDNN has no f32 cell state
// for 16-bit data): c0 is rounded to 16 bits on the way in and c_T comes back widened from 16 bits, and
// the gradients come back in the data type (weight gradients rounded once to 16 bits, like PyTorch's
// cuDNN LSTM). f64 is refused (cuDNN has double RNNs, but mixprec's CPU side has none to compare with).
//
// Note [cuDNN LSTM sequence lengths]
// The data descriptors use CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED with every sequence of length T, which
// is exactly our contiguous [T, B, C] (no padding, so CUDNN_RNN_PADDED_IO_DISABLED). devSeqLengths (the
// same lengths in device memory) is passed although cuDNN 9 also accepts NULL (PyTorch passes NULL): a
// B-element int32 array kept with the plan.
#if defined(MP_HAVE_CUDNN)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cudnn/common.hpp"
#include "backend/key_hash.hpp"
#include "backend/cuda/loops.cuh"
#include "backend/rnn_library_kernels.hpp"
#include "mp/core/math_mode.hpp"

namespace mp::backend::cuda {
namespace {

constexpr const char* kOp = "lstm_layer_library on cuda";

/// First cuDNN version whose RNN API takes bf16 data (Note [cuDNN LSTM precision]).
constexpr size_t kCudnnBf16RnnVersion = 91300;

// ------------------------------------------------------------------ RAII descriptors

class RnnDescriptor {
 public:
  RnnDescriptor() { MP_CUDNN_CHECK(cudnnCreateRNNDescriptor(&desc_)); }
  ~RnnDescriptor() {
    if (desc_ != nullptr) cudnnDestroyRNNDescriptor(desc_);
  }
  RnnDescriptor(const RnnDescriptor&) = delete;
  RnnDescriptor& operator=(const RnnDescriptor&) = delete;
  cudnnRNNDescriptor_t get() const { return desc_; }

 private:
  cudnnRNNDescriptor_t desc_ = nullptr;
};

class RnnDataDescriptor {
 public:
  RnnDataDescriptor() { MP_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(&desc_)); }
  ~RnnDataDescriptor() {
    if (desc_ != nullptr) cudnnDestroyRNNDataDescriptor(desc_);
  }
  RnnDataDescriptor(const RnnDataDescriptor&) = delete;
  RnnDataDescriptor& operator=(const RnnDataDescriptor&) = delete;
  cudnnRNNDataDescriptor_t get() const { return desc_; }

 private:
  cudnnRNNDataDescriptor_t desc_ = nullptr;
};

class DropoutDescriptor {
 public:
  DropoutDescriptor() { MP_CUDNN_CHECK(cudnnCreateDropoutDescriptor(&desc_)); }
  ~DropoutDescriptor() {
    if (desc_ != nullptr) cudnnDestroyDropoutDescriptor(desc_);
  }
  DropoutDescriptor(const DropoutDescriptor&) = delete;
  DropoutDescriptor& operator=(const DropoutDescriptor&) = delete;
  cudnnDropoutDescriptor_t get() const { return desc_; }

 private:
  cudnnDropoutDescriptor_t desc_ = nullptr;
};

// ------------------------------------------------------------------ problems and plans

// Sources of the weight-space copies: our four parameter tensors.
enum Source : int { kWih = 0, kWhh = 1, kBih = 2, kBhh = 3, kSources = 4 };

// One contiguous piece: `bytes` bytes at byte offset `src` of source tensor `source`, at byte offset
// `dst` of the weight space.
struct Piece {
  int source;
  int64_t src, dst, bytes;
};

struct RnnProblem {
  int64_t T = 0, B = 0, I = 0, H = 0;
  DType dtype = DType::f32;
  bool bias = false;
  bool tf32 = false;

  std::array<int64_t, 7> key() const { return {T, B, I, H, static_cast<int64_t>(dtype), bias ? 1 : 0, tf32 ? 1 : 0}; }
  std::string str() const {
    return detail::str_cat("LSTM T ", T, ", B ", B, ", I ", I, ", H ", H, ", ", dtype_name(dtype),
                           bias ? ", two biases" : ", no bias", tf32 ? ", TF32 allowed" : "");
  }
};

struct RnnPlan {
  DropoutDescriptor dropout;
  RnnDescriptor rnn;
  RnnDataDescriptor x, y;
  CudnnTensorDescriptor h;  // h and c: [1, B, H]
  size_t weight_bytes = 0;
  size_t work_train = 0, reserve_train = 0, work_infer = 0;
  std::vector<Piece> pieces;  // our tensors -> the weight space (and back for the gradients)
  Tensor seq_lengths;         // [B] int32 on the device, every entry T
};

using PlanMap = std::unordered_map<std::array<int64_t, 7>, std::unique_ptr<RnnPlan>, KeyHash<std::array<int64_t, 7>>>;

// The plans of one device; only touched while that device's CudnnHandle is held (Note [cuDNN handle]).
// Never destroyed (Note [leaked runtime state]).
PlanMap& plan_cache(int device) { return per_device<PlanMap>(device); }

cudnnMathType_t math_type(const RnnProblem& pr) {
  if (pr.dtype != DType::f32) return CUDNN_TENSOR_OP_MATH;
  return pr.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}

// The weight-space slot of one linLayerID: its matrix (and bias) offsets, after checking that cuDNN
// describes them as we copy them (Note [cuDNN LSTM weights]).
void locate(cudnnHandle_t h, const RnnProblem& pr, RnnPlan& p, const Tensor& space, int id, int64_t* w_off,
            int64_t* b_off) {
  CudnnTensorDescriptor m, b;
  void* m_addr = nullptr;
  void* b_addr = nullptr;
  MP_CUDNN_CHECK_CTX(cudnnGetRNNWeightParams(h, p.rnn.get(), 0, p.weight_bytes, space.raw_data(), id, m.get(), &m_addr,
                                             pr.bias ? b.get() : nullptr, pr.bias ? &b_addr : nullptr),
                     detail::str_cat(pr.str(), ", linLayerID ", id));
  const int64_t in = id < 4 ? pr.I : pr.H;
  // cuDNN describes a matrix as [1, H, in] (a bias as [1, H, 1]); any number of leading/trailing 1s is
  // accepted, but the other dims must be [H, cols] in that order, packed row-major, in the data type.
  auto check = [&](cudnnTensorDescriptor_t d, int64_t cols, const char* what) {
    cudnnDataType_t dt;
    int nb = 0, dims[8] = {0}, strides[8] = {0};
    MP_CUDNN_CHECK(cudnnGetTensorNdDescriptor(d, 8, &dt, &nb, dims, strides));
    std::vector<int64_t> big;  // the dims other than 1, outermost first
    bool packed = nb >= 1 && nb <= 8;
    int64_t inner = 1;
    for (int i = nb - 1; packed && i >= 0; --i) {
      if (dims[i] != 1) {
        packed = strides[i] == inner;
        big.insert(big.begin(), dims[i]);
      }
      inner *= dims[i];
    }
    std::vector<int64_t> want;
    for (int64_t v : {pr.H, cols})
      if (v != 1) want.push_back(v);
    if (packed && big == want && dt == cudnn_dtype(pr.dtype, kOp)) return;
    std::ostringstream shape, st;
    for (int i = 0; i < nb && i < 8; ++i) {
      shape << (i ? ", " : "") << dims[i];
      st << (i ? ", " : "") << strides[i];
    }
    MP_FAIL(kOp, ": cuDNN describes the ", what, " of linLayerID ", id, " as [", shape.str(), "] with strides [",
            st.str(), "] (data type ", static_cast<int>(dt), "), expected [1, ", pr.H, ", ", cols,
            "] packed row-major in ", dtype_name(pr.dtype), " for ", pr.str(),
            "; this cuDNN lays out LSTM weights differently from the one mixprec was written against "
            "(Note [cuDNN LSTM weights]); run the LSTM with nn::LstmImpl::fused");
  };
  check(m.get(), in, "matrix");
  const auto* base = static_cast<const char*>(space.raw_data());
  *w_off = static_cast<const char*>(m_addr) - base;
  *b_off = -1;
  if (pr.bias) {
    check(b.get(), 1, "bias");
    *b_off = static_cast<const char*>(b_addr) - base;
  }
}

std::unique_ptr<RnnPlan> build_plan(cudnnHandle_t h, const RnnProblem& pr, Device dev) {
  auto p = std::make_unique<RnnPlan>();
  const cudnnDataType_t dt = cudnn_dtype(pr.dtype, kOp);
  const cudnnDataType_t math_prec = pr.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  // Dropout 0 with no state buffer: a descriptor that does nothing (as PyTorch's set_no_dropout).
  MP_CUDNN_CHECK(cudnnSetDropoutDescriptor(p->dropout.get(), h, 0.0f, nullptr, 0, 0));
  MP_CUDNN_CHECK_CTX(
      cudnnSetRNNDescriptor_v8(
          p->rnn.get(), CUDNN_RNN_ALGO_STANDARD, CUDNN_LSTM, pr.bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS,
          CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, dt, math_prec, math_type(pr), static_cast<int32_t>(pr.I),
          static_cast<int32_t>(pr.H), static_cast<int32_t>(pr.H), 1, p->dropout.get(), CUDNN_RNN_PADDED_IO_DISABLED),
      pr.str());
  const std::vector<int> lengths(static_cast<size_t>(pr.B), static_cast<int>(pr.T));
  MP_CUDNN_CHECK_CTX(
      cudnnSetRNNDataDescriptor(p->x.get(), dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, static_cast<int>(pr.T),
                                static_cast<int>(pr.B), static_cast<int>(pr.I), lengths.data(), nullptr),
      pr.str() + ", input data descriptor");
  MP_CUDNN_CHECK_CTX(
      cudnnSetRNNDataDescriptor(p->y.get(), dt, CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, static_cast<int>(pr.T),
                                static_cast<int>(pr.B), static_cast<int>(pr.H), lengths.data(), nullptr),
      pr.str() + ", output data descriptor");
  const int dims[3] = {1, static_cast<int>(pr.B), static_cast<int>(pr.H)};
  const int strides[3] = {static_cast<int>(pr.B * pr.H), static_cast<int>(pr.H), 1};
  MP_CUDNN_CHECK_CTX(cudnnSetTensorNdDescriptor(p->h.get(), dt, 3, dims, strides), pr.str() + ", state descriptor");
  MP_CUDNN_CHECK_CTX(cudnnGetRNNWeightSpaceSize(h, p->rnn.get(), &p->weight_bytes), pr.str());
  MP_CUDNN_CHECK_CTX(cudnnGetRNNTempSpaceSizes(h, p->rnn.get(), CUDNN_FWD_MODE_TRAINING, p->x.get(), &p->work_train,
                                               &p->reserve_train),
                     pr.str() + ", training");
  MP_CUDNN_CHECK_CTX(
      cudnnGetRNNTempSpaceSizes(h, p->rnn.get(), CUDNN_FWD_MODE_INFERENCE, p->x.get(), &p->work_infer, nullptr),
      pr.str() + ", inference");
  p->seq_lengths = upload(lengths.data(), lengths.size() * sizeof(int), dev);

  // Where cuDNN keeps each matrix and bias (Note [cuDNN LSTM weights]): asked once against a scratch
  // weight space, kept as byte offsets. Piece order: W_i..W_o, R_i..R_o, b_W*, b_R*.
  const Tensor space = cudnn_workspace(p->weight_bytes, dev);
  MP_CHECK(space.defined(), kOp, ": cuDNN reports an empty weight space for ", pr.str());
  const int64_t es = static_cast<int64_t>(dtype_size(pr.dtype));
  std::vector<Piece> raw;
  std::vector<Piece> biases;
  for (int id = 0; id < 8; ++id) {
    int64_t w_off = 0, b_off = -1;
    locate(h, pr, *p, space, id, &w_off, &b_off);
    const int gate = id % 4;
    const int64_t in = id < 4 ? pr.I : pr.H;
    raw.push_back(Piece{id < 4 ? kWih : kWhh, gate * pr.H * in * es, w_off, pr.H * in * es});
    if (pr.bias) biases.push_back(Piece{id < 4 ? kBih : kBhh, gate * pr.H * es, b_off, pr.H * es});
    MP_CHECK(w_off >= 0 && w_off + pr.H * in * es <= static_cast<int64_t>(p->weight_bytes) &&
                 (!pr.bias || (b_off >= 0 && b_off + pr.H * es <= static_cast<int64_t>(p->weight_bytes))),
             kOp, ": cuDNN reports linLayerID ", id, " outside its own weight space of ", p->weight_bytes,
             " bytes for ", pr.str());
  }
  raw.insert(raw.end(), biases.begin(), biases.end());
  for (const Piece& q : raw) {  // merge pieces adjacent in both the source and the weight space
    Piece* last = p->pieces.empty() ? nullptr : &p->pieces.back();
    if (last != nullptr && last->source == q.source && last->src + last->bytes == q.src &&
        last->dst + last->bytes == q.dst)
      last->bytes += q.bytes;
    else
      p->pieces.push_back(q);
  }
  return p;
}

RnnProblem problem_of(const LstmLibraryInputs& in) {
  RnnProblem pr;
  pr.T = in.x.size(0);
  pr.B = in.x.size(1);
  pr.I = in.x.size(2);
  pr.H = in.h0.size(1);
  pr.dtype = in.x.dtype();
  pr.bias = in.b_ih.defined() || in.b_hh.defined();
  pr.tf32 = pr.dtype == DType::f32 && float32_matmul_precision() == Float32MatmulPrecision::high;
  MP_CHECK(pr.dtype == DType::f32 || pr.dtype == DType::f16 || pr.dtype == DType::bf16, kOp,
           ": the cuDNN LSTM runs in f32, f16 or bf16, got ", dtype_name(pr.dtype),
           "; convert the operands with .to(mp::DType::f32), or use mp::lstm_layer (nn::LstmImpl::fused), which "
           "takes every floating dtype");
  if (pr.dtype == DType::bf16) {
    const size_t v = cudnnGetVersion();
    MP_CHECK(v >= kCudnnBf16RnnVersion, kOp, ": cuDNN ", v / 10000, ".", v / 100 % 100,
             " has no bf16 RNN (cuDNN 9.13 added it); use f16 or f32, put a newer libcudnn first on the library "
             "path, or use mp::lstm_layer (nn::LstmImpl::fused) for bf16");
  }
  const bool ok = fits_int(pr.T) && fits_int(pr.B) && fits_int(pr.I) && fits_int(pr.H) && fits_int(4 * pr.H) &&
                  fits_int(pr.T * pr.B * std::max(pr.I, pr.H)) && fits_int(4 * pr.H * std::max(pr.I, pr.H));
  MP_CHECK(ok, kOp, ": ", pr.str(),
           " has a tensor of 2^31 or more elements, more than cuDNN's RNN API takes; use "
           "mp::lstm_layer (nn::LstmImpl::fused) or a shorter sequence");
  return pr;
}

RnnPlan& get_plan(cudnnHandle_t h, const RnnProblem& pr, Device dev) {
  PlanMap& cache = plan_cache(dev.index);
  auto it = cache.find(pr.key());
  if (it == cache.end()) it = cache.emplace(pr.key(), build_plan(h, pr, dev)).first;
  return *it->second;
}

char* at_byte(const Tensor& t, int64_t off) { return static_cast<char*>(t.raw_data()) + off; }

// t converted to dtype dt (t itself when it already has it), contiguous and 16-byte aligned.
Tensor in_dtype(const Tensor& t, DType dt) {
  if (t.dtype() == dt) return cudnn_dense(t);
  Tensor out = mp::empty(t.sizes(), {.dtype = dt, .device = t.device()});
  convert_dtype_into(out, t.contiguous());
  return out;
}

// The weight space of one call: zeros, then our tensors copied into cuDNN's slots.
Tensor pack_weights(const RnnPlan& p, const LstmLibraryInputs& in, DType dt, Device dev) {
  const Tensor space = cudnn_workspace(p.weight_bytes, dev);
  cudaStream_t s = current_stream(dev.index);
  MP_CUDA_CHECK(cudaMemsetAsync(space.raw_data(), 0, p.weight_bytes, s));
  const int64_t n = in.w_ih.size(0);
  const Tensor src[kSources] = {in.w_ih, in.w_hh, in.b_ih.defined() ? param_vector(in.b_ih, n, dt, 0.0, dev) : Tensor(),
                                in.b_hh.defined() ? param_vector(in.b_hh, n, dt, 0.0, dev) : Tensor()};
  for (const Piece& q : p.pieces) {
    if (!src[q.source].defined()) continue;  // an undefined bias stays zero
    MP_CUDA_CHECK(cudaMemcpyAsync(at_byte(space, q.dst), at_byte(src[q.source], q.src), static_cast<size_t>(q.bytes),
                                  cudaMemcpyDeviceToDevice, s));
  }
  return space;
}

// ------------------------------------------------------------------ kernel entries

// saved: {weight space, reserve space, x, h0, c0 as used (data type, aligned), flags}. flags is a CPU i64
// [2]: the forward's TF32 switch (the backward must use the forward's RNN descriptor even if the matmul
// precision changed since) and whether a backward already ran. Note [cuDNN reserve space is consumed]:
// cudnnRNNBackwardData_v8 writes into the reserve space what cudnnRNNBackwardWeights_v8 reads, so the
// forward's reserve space serves ONE backward; a second backward through the same forward (retain_graph)
// is refused with a clear error rather than computed from overwritten data. (oneDNN's workspace on the
// CPU is read-only in its backward: there a second backward gives the same gradients.)
enum Saved : size_t { kSpace = 0, kReserve = 1, kX = 2, kH0 = 3, kC0 = 4, kFlags = 5, kSavedCount = 6 };

LstmLibraryForward lstm_library_forward_cuda(const LstmLibraryInputs& in, bool training) {
  const Device dev = in.x.device();
  DeviceGuard guard(dev, "lstm_layer_library");
  const RnnProblem pr = problem_of(in);
  const DType dt = pr.dtype;
  CudnnHandle handle(dev.index);
  RnnPlan& p = get_plan(handle.get(), pr, dev);
  const Tensor x = cudnn_dense(in.x), h0 = cudnn_dense(in.h0), c0 = in_dtype(in.c0, dt);
  const Tensor space = pack_weights(p, in, dt, dev);
  LstmLibraryForward r;
  r.y = mp::empty({pr.T, pr.B, pr.H}, {.dtype = dt, .device = dev});
  r.h_n = mp::empty({pr.B, pr.H}, {.dtype = dt, .device = dev});
  const Tensor cy = mp::empty({pr.B, pr.H}, {.dtype = dt, .device = dev});
  const size_t work_bytes = training ? p.work_train : p.work_infer;
  const size_t reserve_bytes = training ? p.reserve_train : 0;
  const Tensor work = cudnn_workspace(work_bytes, dev), reserve = cudnn_workspace(reserve_bytes, dev);
  MP_CUDNN_CHECK_CTX(
      cudnnRNNForward(handle.get(), p.rnn.get(), training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
                      static_cast<const int32_t*>(p.seq_lengths.raw_data()), p.x.get(), x.raw_data(), p.y.get(),
                      r.y.raw_data(), p.h.get(), h0.raw_data(), r.h_n.raw_data(), p.h.get(), c0.raw_data(),
                      cy.raw_data(), p.weight_bytes, space.raw_data(), work_bytes,
                      work.defined() ? work.raw_data() : nullptr, reserve_bytes,
                      reserve.defined() ? reserve.raw_data() : nullptr),
      pr.str());
  if (dt == DType::f32) {
    r.c_n = cy;
  } else {
    r.c_n = mp::empty({pr.B, pr.H}, {.dtype = DType::f32, .device = dev});
    convert_dtype_into(r.c_n, cy);
  }
  if (training) {
    r.saved.resize(kSavedCount);
    r.saved[kSpace] = space;
    r.saved[kReserve] = reserve;
    r.saved[kX] = x;
    r.saved[kH0] = h0;
    r.saved[kC0] = c0;
    r.saved[kFlags] = from_vector<int64_t>({pr.tf32 ? 1 : 0, 0}, {2}, {.dtype = DType::i64});
  }
  return r;
}

LstmLibraryGrads lstm_library_backward_cuda(const LstmLibraryInputs& in, const LstmLibraryForward& fwd,
                                            const Tensor& dy_in, const Tensor& dh_in, const Tensor& dc_in) {
  const Device dev = in.x.device();
  DeviceGuard guard(dev, "lstm_layer_library backward");
  MP_ASSERT(fwd.saved.size() == kSavedCount, kOp, ": the backward needs the saved state of a training forward");
  int64_t* flags = fwd.saved[kFlags].data_ptr<int64_t>();
  MP_CHECK(flags[1] == 0, kOp, ": a second backward through the same forward (retain_graph) is not supported: ",
           "cuDNN's first backward consumed the reserve space (Note [cuDNN reserve space is consumed]); run the ",
           "forward again, or use mp::lstm_layer (nn::LstmImpl::fused), whose graph may be back-propagated twice");
  flags[1] = 1;
  RnnProblem pr = problem_of(in);
  pr.tf32 = flags[0] != 0;
  const DType dt = pr.dtype;
  CudnnHandle handle(dev.index);
  RnnPlan& p = get_plan(handle.get(), pr, dev);
  const Tensor& space = fwd.saved[kSpace];
  const Tensor& reserve = fwd.saved[kReserve];
  const Tensor &x = fwd.saved[kX], &h0 = fwd.saved[kH0], &c0 = fwd.saved[kC0];
  MP_ASSERT(space.numel() == static_cast<int64_t>(p.weight_bytes) &&
                (reserve.defined() ? reserve.numel() : 0) == static_cast<int64_t>(p.reserve_train),
            kOp, ": saved weight/reserve space sizes do not match the plan of ", pr.str());
  const Tensor dy = in_dtype(dy_in, dt), dhy = in_dtype(dh_in, dt), dcy = in_dtype(dc_in, dt);
  LstmLibraryGrads g;
  g.dx = mp::empty({pr.T, pr.B, pr.I}, {.dtype = dt, .device = dev});
  g.dh0 = mp::empty({pr.B, pr.H}, {.dtype = dt, .device = dev});
  g.dc0 = mp::empty({pr.B, pr.H}, {.dtype = dt, .device = dev});
  const Tensor work = cudnn_workspace(p.work_train, dev);
  void* work_ptr = work.defined() ? work.raw_data() : nullptr;
  void* reserve_ptr = reserve.defined() ? reserve.raw_data() : nullptr;
  const auto* lengths = static_cast<const int32_t*>(p.seq_lengths.raw_data());
  // BackwardData first: it updates the reserve space BackwardWeights then reads.
  MP_CUDNN_CHECK_CTX(
      cudnnRNNBackwardData_v8(handle.get(), p.rnn.get(), lengths, p.y.get(), fwd.y.raw_data(), dy.raw_data(), p.x.get(),
                              g.dx.raw_data(), p.h.get(), h0.raw_data(), dhy.raw_data(), g.dh0.raw_data(), p.h.get(),
                              c0.raw_data(), dcy.raw_data(), g.dc0.raw_data(), p.weight_bytes, space.raw_data(),
                              p.work_train, work_ptr, p.reserve_train, reserve_ptr),
      pr.str() + ", backward data");
  const Tensor dspace = cudnn_workspace(p.weight_bytes, dev);
  cudaStream_t s = current_stream(dev.index);
  MP_CUDA_CHECK(cudaMemsetAsync(dspace.raw_data(), 0, p.weight_bytes, s));  // WGRAD_MODE_ADD adds into it
  MP_CUDNN_CHECK_CTX(
      cudnnRNNBackwardWeights_v8(handle.get(), p.rnn.get(), CUDNN_WGRAD_MODE_ADD, lengths, p.x.get(), x.raw_data(),
                                 p.h.get(), h0.raw_data(), p.y.get(), fwd.y.raw_data(), p.weight_bytes,
                                 dspace.raw_data(), p.work_train, work_ptr, p.reserve_train, reserve_ptr),
      pr.str() + ", backward weights");
  // The gradients out of the gradient space; the input-side bias slots hold d b_ih, equal to d b_hh
  // (both biases enter every gate as a sum).
  g.dw_ih = mp::empty({4 * pr.H, pr.I}, {.dtype = dt, .device = dev});
  g.dw_hh = mp::empty({4 * pr.H, pr.H}, {.dtype = dt, .device = dev});
  if (pr.bias) g.db = mp::empty({4 * pr.H}, {.dtype = dt, .device = dev});
  const Tensor dst[kSources] = {g.dw_ih, g.dw_hh, g.db, Tensor()};
  for (const Piece& q : p.pieces) {
    if (!dst[q.source].defined()) continue;
    MP_CUDA_CHECK(cudaMemcpyAsync(at_byte(dst[q.source], q.src), at_byte(dspace, q.dst), static_cast<size_t>(q.bytes),
                                  cudaMemcpyDeviceToDevice, s));
  }
  return g;
}

}  // namespace

MP_REGISTER_KERNEL(lstm_library_forward_kernel, DeviceType::cuda, &lstm_library_forward_cuda);
MP_REGISTER_KERNEL(lstm_library_backward_kernel, DeviceType::cuda, &lstm_library_backward_cuda);

}  // namespace mp::backend::cuda

#endif  // MP_HAVE_CUDNN
