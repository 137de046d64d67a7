"""Performance benchmark: bias construction, training steps, evaluation, a peer library, FLOP/s.

    posab bench [--quick] [--out DIR] [--sections 1,2,3,4,5,6,7] [--repeats N] [--threads N]
                            [--no-progress]

Sections (sizes from the composed config: the default model, train.seq_len x train.batch_size, and
eval.lengths; `--quick` swaps in the tiny model, L=64, batch 2 and lengths 64, 128):

1. The learned biases (multiscale, hierarchical) alone, at every eval length: the distinct-distance method
   of the modules against the design note's all-pairs method (`posab.encodings.reference`), in three
   phases: build (inference mode), forward (graph recorded) and forward+backward (a fixed upstream
   gradient into the MLP weights). Ratios: all-pairs / distinct. (`bias.py`)
2. One training step for every encoding: `posab.training.Trainer.step` itself (a sampled batch, forward,
   backward, clipping, AdamW, schedule), on a synthetic token stream; ratio to nope. (`train_step.py`)
3. One evaluation forward pass (inference mode) for every encoding at every eval length, with the
   evaluation batch rule max(1, eval.batch_tokens // L). (`eval_forward.py`)
4. The same Trainer step for x-transformers' model (the `bench` extra) with the same sizes: rope vs its
   rotary_pos_emb, alibi vs alibi_pos_bias, multiscale vs dynamic_pos_bias; ratio posab / x-transformers.
   (`peer.py`)
5. Model FLOP/s of a training step as a share of the measured matmul peak in the training dtype, for the
   default model and `model=medium` (the 40% target's), with the matmul kernels that ran (`kernels.py`:
   torch's CPU capability and oneDNN's primitive, in bench.md's machine table). (`flops.py`)
6. Where a training step goes: `torch.profiler` operators by self CPU time per step, for nope, rope,
   alibi, hierarchical and x-transformers' rotary model; whole tables in profile_<case>.txt. (`profile.py`)
7. The chunked core's chunk size: the training step of each kernel's encoding with its chunk of query rows
   set to 8, 16, 32, 64 and 128, interleaved; ratio to the kernel's fastest, and whether its declared chunk
   is within the rule's tolerance. (`chunks.py`)

`posab bench decoding` (`decoding.py`, its own options; results/bench/decoding/) times cached decoding
against a full forward pass per token for every encoding, with the cache's memory and the logits' agreement.

The goals the tables are held to are data (`targets.py`); `output.py` writes one CSV per section,
targets.csv and bench.md, into results/bench/ for a full run and outputs/bench_quick/ for a quick one.

Every section runs under the training precision (bf16 autocast where the CPU has native bf16). Times are
medians of `--repeats` runs after warm-up runs; runs that are compared are interleaved round-robin, so
that a change in machine load hits all of them alike (`measure.py`).
"""
