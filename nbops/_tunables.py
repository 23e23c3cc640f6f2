"""The measured numbers that shape nbops' CPU kernels, in one place.

Serial thresholds (below them a call stays on the calling thread), block
sizes and prefetch distances. Each says what it bounds and, on its
``bench:`` line, the benchmark that measures the choice; rerun that one
before changing a value (the figures behind the values are in
docs/benchmarks.md). Kernel modules import these under their own names
(tests patch them there); kernels fold them in as compile-time constants,
so ``_jit.SHARED_SOURCES`` keys every kernel's disk cache on this file.
"""

# --- serial thresholds: waking the thread pool costs more than the loop -------

#: Elements below which elementwise kernels (activations, normalization,
#: optimizer updates, loss rows) run their serial twin.
#: bench: tools/serial_threshold.py (relu and gelu, serial vs parallel by size)
SERIAL_BELOW = 32768

#: Elements below which an ``nbops.fuse`` kernel runs serially: ``x * y + 1``
#: on 2 threads was even at 32K elements and parallel won from 128K, so the
#: threshold sits between (a measurement of its own, not SERIAL_BELOW's).
#: bench: tools/bench_fusion.py
FUSION_SERIAL_BELOW = 1 << 16

#: Bytes below which a strided copy or transpose runs on the calling thread.
#: bench: tools/bench_tensor.py
COPY_SERIAL_BYTES = 1 << 18

#: Flops below which a BLAS-route GEMM runs on one thread (NumPy's BLAS
#: also keeps small products on the calling thread).
#: bench: tools/bench_gemm.py
BLAS_SERIAL_FLOPS = 1_000_000

# --- block sizes -------------------------------------------------------------

#: Elements per task of the activation kernels with a vector run (softplus).
#: bench: benchmarks/bench_activations.py
RUN_BLOCK = 4096

#: Elements per block of the streamed activation kernels (8-16 KiB: L1-resident).
#: bench: benchmarks/bench_activations.py
STREAM_BLOCK = 2048

#: Elements a normalization reduction sums in the input's dtype before the
#: float64 total (float32 error stays at a few ulp; 16 lanes wide).
#: bench: benchmarks/bench_normalization.py
NORM_SUM_BLOCK = 256

#: Least elements per block of the channel reductions (thread start-up and
#: the partials' merge stay small beside the work).
#: bench: benchmarks/bench_normalization.py
NORM_MIN_BLOCK = 4096

#: Bytes of one softmax column block (n x width elements) kept in L2 between passes.
#: bench: benchmarks/bench_softmax.py
SOFTMAX_BLOCK_BYTES = 1 << 17

#: Elements a softmax row sums in the input's type before the float64 total.
#: bench: benchmarks/bench_softmax.py
SOFTMAX_SUM_BLOCK = 512

#: Innermost-axis elements per chunk of a fused map or reduction along it.
#: bench: tools/bench_fusion.py
FUSION_MIN_CHUNK = 4096

#: Innermost-axis chunk when a fused reduction runs over another axis: its
#: float64 accumulators (16 KiB) stay in L1.
#: bench: tools/bench_fusion.py
FUSION_OUTER_CHUNK = 2048

#: Tile edge of the transpose kernel, in elements (longer rows beat L1 residency).
#: bench: tools/bench_tensor.py --tile
TRANSPOSE_TILE = 256

#: Padding of a transpose buffer row, in elements (columns off one cache set).
#: bench: tools/bench_tensor.py
TRANSPOSE_PAD = 16

#: Elements per work item when a copy has fewer rows than threads can share.
#: bench: tools/bench_tensor.py
COPY_CHUNK = 1 << 15

#: Columns of C the GEMM epilogue runs over at a time after the micro-kernel
#: stored them (long rows, as the activations' flat kernels).
#: bench: tools/bench_gemm.py
EPILOGUE_COLS = 256

#: Tasks per thread the GEMM tile driver aims for (load balance vs. A re-packing).
#: bench: tools/bench_gemm.py
GEMM_TASKS_PER_THREAD = 4

#: Default bound of the small-product route on m, n and k (``SMALL`` of the
#: GEMM's default config): A, B and C of a 128^3 float32 product take 192
#: KiB, inside L2, and each k x 32 panel of B stays in L1 while A streams
#: past it; ahead of the packed driver up to 256^3, kept at 128 so that the
#: A rows a tile streams stay in L2.
#: bench: tools/bench_gemm.py --group small small-shapes
GEMM_SMALL_MAX = 128

#: Rows of A up to which one product takes the matrix-vector route (each
#: element of B read once and used ``m`` times, too few to pay for packing
#: it; at 64 rows the packed driver is ahead again); its column blocks per
#: thread and least columns per block.
#: bench: tools/bench_gemm.py --group linear
GEMV_MAX_ROWS = 16
GEMV_TASKS_PER_THREAD = 4
GEMV_MIN_COLUMNS = 16

#: Rows of A up to which one product whose B has contiguous columns (a
#: linear layer's ``x @ W.T``) takes the streamed-weight route where the
#: config enables it: the packed driver copies the whole weight every call,
#: and past this bound the transposed result outgrows the caches.
#: bench: tools/bench_gemm.py --group linear
STREAM_MAX_ROWS = 512
#: Blocks of C's columns per thread of the streamed-weight route.
#: bench: tools/bench_gemm.py --group linear
STREAM_TASKS_PER_THREAD = 4

#: Bytes of C one BLAS-route band spans at most when an epilogue runs on it
#: (about half an L2).
#: bench: tools/bench_gemm.py (the nbops-blas cases)
BLAS_BLOCK_BYTES = 512 * 1024

#: Tasks per thread the implicit-GEMM convolution aims for (load balance vs.
#: re-packing).
#: bench: benchmarks/bench_conv.py
CONV_TASKS_PER_THREAD = 2

#: Output tiles per task of the direct convolution (one run of tiles along an
#: image's output, for one group and one block of its output channels).
#: bench: benchmarks/bench_conv.py
DIRECT_TILES_PER_TASK = 8

#: Tasks per thread that the direct convolution adds channel blocks for,
#: where runs of tiles alone are too few.
#: bench: benchmarks/bench_conv.py
DIRECT_TASKS_PER_THREAD = 4

#: Bytes of padded input planes and output per step of images (direct convolution).
#: bench: benchmarks/bench_conv.py
DIRECT_STEP_BYTES = 16 << 20

#: Tasks per thread the attention forward aims for (load balance vs. per-task set-up).
#: bench: benchmarks/bench_attention.py
ATTENTION_TASKS_PER_THREAD = 4

#: Rows of A per task of the int8 GEMM (the MC x k block stays in L2 while
#: every column sliver of the task streams past it).
#: bench: benchmarks/bench_quant.py
QGEMM_MC = 64

#: Tasks per thread the int8 GEMM driver aims for.
#: bench: benchmarks/bench_quant.py
QGEMM_TASKS_PER_THREAD = 4

#: Most neurons per forward chunk of the spiking kernels (long unit-stride
#: input rows while the chunk's state stays near L2).
#: bench: tools/bench_neuromorphic.py
NEURON_CHUNK = 131072

#: Bytes of chunk-local buffers per backward chunk of the spiking kernels.
#: bench: tools/bench_neuromorphic.py
NEURON_BACKWARD_BUFFER = 1024 * 1024

#: Items (rows + nonzeros) per sparse chunk below which more chunks only add overhead.
#: bench: tools/bench_sparse.py
SPARSE_GRAIN = 4096

#: Sparse chunks per thread (a few per thread absorb uneven memory latency).
#: bench: tools/bench_sparse.py
SPARSE_CHUNKS_PER_THREAD = 4

# --- prefetch distances --------------------------------------------------------

#: Rows of B ahead that the GEMM's row-by-row packing requests.
#: bench: tools/bench_gemm.py
PREFETCH_ROWS = 8

#: Bytes of a small product's operands (A and B) within which the
#: small-product GEMM prefetches its task's next product: each operand spans
#: one to four pages, where the hardware prefetchers stop; smaller products
#: lose (more prefetches than vector work), larger gain nothing.
#: bench: tools/bench_gemm.py --group small small-shapes
PREFETCH_PRODUCT_BYTES = (4096, 16384)

#: Elements of the next softmax row prefetched while the current one is computed.
#: bench: benchmarks/bench_softmax.py
SOFTMAX_PREFETCH = 4096

#: Nonzeros ahead whose dense row the sparse kernels prefetch (4, 8 and 16 alike).
#: bench: tools/bench_sparse.py
SPARSE_AHEAD = 8

# --- streaming stores ----------------------------------------------------------

#: Outputs from this many bytes on are written with non-temporal stores by
#: the kernels that offer it: half the L3 of the machines nbops is tuned on
#: (32 MiB), so that an output that could stay in cache for its consumer does.
#: bench: benchmarks/bench_activations.py (16M elements), benchmarks/bench_softmax.py
STREAM_BYTES = 16 << 20

# --- CUDA launch sizes (the simulator's smaller overrides stay in the kernel
# modules). Chosen as common defaults, not yet timed on a GPU: the GPU
# suites are the asv benchmarks named, run where a GPU is present.

#: Threads per block of 1-D elementwise kernels (nbops/cuda/_launch.py).
#: bench: benchmarks/bench_activations.py on a GPU
CUDA_THREADS = 256

#: Tile edge of 2-D tiled kernels (transpose) and rows of threads per tile.
#: bench: benchmarks/bench_tensor.py on a GPU
CUDA_TILE = 32
CUDA_TILE_ROWS = 8

#: Output pixels per block of the direct convolution, and weight taps
#: staged in shared memory per chunk.
#: bench: benchmarks/bench_conv.py on a GPU
CUDA_CONV_THREADS = 128
CUDA_CONV_WCHUNK = 512

#: Rows per partial sum of the normalization weight and bias gradients.
#: bench: benchmarks/bench_normalization.py on a GPU
CUDA_NORM_ROW_CHUNK = 128

#: Rows up to this length are summed by one thread each in the CUDA
#: reductions (a block per row would leave most of its threads idle).
#: bench: benchmarks/bench_autograd.py on a GPU
CUDA_SHORT_ROW = 64
