//! Fencing tokens: the cluster's durable floor per key (`floor`, pure; `floor_record` reads and writes its
//! ConfigMap), earlier grants' values that came back after their holders stopped (`earlier_values`), and a token
//! that cannot advance any more (`exhausted`).

pub mod earlier_values;
pub mod exhausted;
pub mod floor;
pub mod floor_record;
