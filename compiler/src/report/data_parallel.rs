//! The data-parallel part of the memory report: one rank's share of the optimizer state and the
//! bytes it sends a step, with their time on a few networks.

use serde::{Deserialize, Serialize};

use crate::plan::Plan;

/// One rank of a data-parallel step ([`dmc_plan::shard`]): its part of the batch, its shard of
/// the optimizer state, and the bytes it sends a step with their time on each network of
/// [`dmc_plan::link::NETWORKS`] (sending and receiving at once, at the link's rate).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataParallel {
    pub ranks: usize,
    /// Samples per rank (the global batch is `ranks` times this).
    pub batch: usize,
    /// Optimizer-state bytes one rank holds (the largest shards) ...
    pub state_bytes_per_rank: u64,
    /// ... and that one process would hold.
    pub state_bytes_whole: u64,
    /// Parameter bytes each rank holds at home (sharded parameters, ZeRO-3: its rows; else all)
    /// and that one process holds.
    #[serde(default)]
    pub param_bytes_per_rank: u64,
    #[serde(default)]
    pub param_bytes_whole: u64,
    /// Bytes the busiest rank sends a step.
    pub sent_bytes_per_rank: u64,
    /// (link, seconds) for those bytes.
    pub link_seconds: Vec<(String, f64)>,
}

/// The [`DataParallel`] report of `plan` (`None` with one rank).
pub fn data_parallel(plan: &Plan) -> Option<DataParallel> {
    if plan.ranks <= 1 {
        return None;
    }
    let (mine, whole) = dmc_plan::shard::state_bytes(plan);
    let params = dmc_plan::shard::param_bytes(plan);
    let sent = (0..plan.ranks)
        .map(|r| dmc_plan::shard::sent_bytes(plan, r))
        .max()
        .unwrap_or(0);
    Some(DataParallel {
        ranks: plan.ranks,
        batch: plan.batch,
        state_bytes_per_rank: mine,
        state_bytes_whole: whole,
        param_bytes_per_rank: params.0,
        param_bytes_whole: params.1,
        sent_bytes_per_rank: sent,
        link_seconds: dmc_plan::link::NETWORKS
            .iter()
            .map(|l| (l.name.to_string(), sent as f64 / l.bytes_per_s))
            .collect(),
    })
}
