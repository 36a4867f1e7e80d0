//! Seeded sample orders: the per-epoch permutation of the samples ([`epoch_order`]) and its cut
//! into fixed-size batches ([`Epoch`]), the same on every platform for the same seed; and the
//! unshuffled file order ([`Epoch::in_order`]).

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A ChaCha8 stream `stream` of `seed` (the synthetic data draws from it too).
pub(super) fn rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(stream);
    r
}

/// A seeded permutation of `0..samples` for `epoch` (Fisher-Yates on ChaCha8): the same for the
/// same `(samples, seed, epoch)` on every platform, different across epochs and seeds.
pub fn epoch_order(samples: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut r = rng(seed ^ 0x5348_5546_464c_4521, epoch);
    permutation(samples, &mut r)
}

pub(super) fn permutation(n: usize, r: &mut ChaCha8Rng) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        // Multiply-shift: unbiased enough for any realistic n, and stable across rand versions.
        let j = ((r.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize;
        v.swap(i, j);
    }
    v
}

/// The batches of one epoch: a sample order cut into fixed-size batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    order: Vec<usize>,
    batch_size: usize,
    samples: usize,
}

impl Epoch {
    /// A shuffled epoch of `samples / batch_size` full batches; the remainder is dropped.
    /// Panics if `batch_size` is 0.
    pub fn shuffled(samples: usize, batch_size: usize, seed: u64, epoch: u64) -> Epoch {
        assert!(batch_size > 0, "batch size must be positive");
        let mut order = epoch_order(samples, seed, epoch);
        order.truncate(samples / batch_size * batch_size);
        Epoch {
            order,
            batch_size,
            samples,
        }
    }

    /// The samples in file order, `samples / batch_size` full batches; the remainder is dropped
    /// (a training epoch without shuffling: every epoch the same batches, in the same order).
    /// Panics if `batch_size` is 0.
    pub fn in_order(samples: usize, batch_size: usize) -> Epoch {
        assert!(batch_size > 0, "batch size must be positive");
        Epoch {
            order: (0..samples / batch_size * batch_size).collect(),
            batch_size,
            samples,
        }
    }

    /// Every sample in order; the last batch is padded by repeating samples from the start, see
    /// [`Epoch::valid`]. Panics if `batch_size` is 0.
    pub fn in_order_padded(samples: usize, batch_size: usize) -> Epoch {
        assert!(batch_size > 0, "batch size must be positive");
        let total = samples.div_ceil(batch_size) * batch_size;
        let order = (0..total)
            .map(|i| if samples == 0 { 0 } else { i % samples })
            .collect();
        Epoch {
            order,
            batch_size,
            samples,
        }
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    pub fn num_batches(&self) -> usize {
        self.order.len() / self.batch_size
    }

    /// The sample indices of batch `i`.
    pub fn batch(&self, i: usize) -> &[usize] {
        &self.order[i * self.batch_size..(i + 1) * self.batch_size]
    }

    /// Every batch, in order.
    pub fn batches(&self) -> std::slice::ChunksExact<'_, usize> {
        self.order.chunks_exact(self.batch_size)
    }

    /// How many leading entries of batch `i` are real samples (the rest is padding).
    pub fn valid(&self, i: usize) -> usize {
        self.samples
            .saturating_sub(i * self.batch_size)
            .min(self.batch_size)
    }

    /// Samples left out of this epoch (the dropped partial batch of a shuffled epoch).
    pub fn dropped(&self) -> usize {
        self.samples.saturating_sub(self.order.len())
    }
}
