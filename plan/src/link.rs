//! The host-device links that streaming's copies cross ([`crate::plan::Plan::transfer_totals`]),
//! with their data-sheet bandwidths, and the time a plan's copies take on one: the
//! prediction `dmc plan` sets beside the compute time of a streamed step.

use serde::{Deserialize, Serialize};

use crate::plan::TransferTotals;

/// A host-device link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub name: &'static str,
    /// Bytes per second in each direction (the data sheet's x16 rate; pinned copies reach
    /// about 80-90% of it).
    pub bytes_per_s: f64,
}

/// PCIe 3.0, 4.0 and 5.0 x16 (8, 16 and 32 GT/s per lane, 128b/130b encoding).
pub const LINKS: [Link; 3] = [
    Link {
        name: "PCIe 3.0 x16",
        bytes_per_s: 15.75e9,
    },
    Link {
        name: "PCIe 4.0 x16",
        bytes_per_s: 31.5e9,
    },
    Link {
        name: "PCIe 5.0 x16",
        bytes_per_s: 63.0e9,
    },
];

/// Seconds the copies of one run take on `link`: every copy in turn on one copy engine (the
/// CUDA backend queues them on one stream), each direction at the link's rate.
pub fn transfer_seconds(t: &TransferTotals, link: &Link) -> f64 {
    (t.host_to_device + t.device_to_host) as f64 / link.bytes_per_s
}

/// Links between the ranks of a data-parallel step ([`crate::shard::sent_bytes`]): Ethernet and
/// InfiniBand between nodes, NVLink between the GPUs of one node (data-sheet rates per
/// direction).
pub const NETWORKS: [Link; 3] = [
    Link {
        name: "25 Gb/s Ethernet",
        bytes_per_s: 3.125e9,
    },
    Link {
        name: "100 Gb/s InfiniBand EDR",
        bytes_per_s: 12.5e9,
    },
    Link {
        name: "NVLink 4 (H100, 450 GB/s)",
        bytes_per_s: 450e9,
    },
];
