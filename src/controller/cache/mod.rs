//! The watch caches the reconcilers read beyond kube-runtime's stores: pods trimmed to what elections and Job
//! fencing read, and indexed by namespace and label. Below `context` and the policies that read them; the wiring
//! (`run`) only feeds them from its watches.

pub mod finished_pods;
pub mod pod_cache;
pub mod pod_index;
pub mod stopped_pods;
