//! The resources served: a fixed table, one entry per resource, with what each kind's registry strategy
//! decides differently from the generic store.

/// Behaviour that belongs to one kind's registry strategy rather than to the generic store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Special {
    Plain,
    Secret,
    Pod,
    Job,
    Namespace,
    Crd,
    /// A custom resource: served only while its CRD exists.
    Custom,
}

#[derive(Debug)]
pub(super) struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a `/status` subresource: writes to the main resource keep the stored status.
    pub status: bool,
    /// Tracks `metadata.generation`.
    pub generation: bool,
    /// PUT without metadata.resourceVersion is accepted (the strategy's AllowUnconditionalUpdate).
    pub unconditional_update: bool,
    /// DELETE answers with the deleted object instead of a Status (the store's ReturnDeletedObject).
    pub returns_deleted: bool,
    pub special: Special,
}

const BASE: Kind = Kind {
    group: "",
    version: "v1",
    plural: "",
    kind: "",
    namespaced: true,
    status: false,
    generation: false,
    unconditional_update: true,
    returns_deleted: false,
    special: Special::Plain,
};

pub(super) static KINDS: [Kind; 13] = [
    Kind {
        plural: "pods",
        kind: "Pod",
        status: true,
        generation: true,
        returns_deleted: true,
        special: Special::Pod,
        ..BASE
    },
    Kind {
        plural: "secrets",
        kind: "Secret",
        special: Special::Secret,
        ..BASE
    },
    Kind {
        plural: "configmaps",
        kind: "ConfigMap",
        ..BASE
    },
    Kind {
        plural: "namespaces",
        kind: "Namespace",
        namespaced: false,
        special: Special::Namespace,
        ..BASE
    },
    // Served for the nodes the harnesses register (and the pod garbage collector reads); the node strategy
    // keeps the status given at creation, as the generic store does.
    Kind {
        plural: "nodes",
        kind: "Node",
        namespaced: false,
        status: true,
        ..BASE
    },
    Kind {
        group: "events.k8s.io",
        plural: "events",
        kind: "Event",
        ..BASE
    },
    Kind {
        group: "coordination.k8s.io",
        plural: "leases",
        kind: "Lease",
        unconditional_update: false,
        ..BASE
    },
    Kind {
        group: "batch",
        plural: "jobs",
        kind: "Job",
        status: true,
        generation: true,
        special: Special::Job,
        ..BASE
    },
    Kind {
        group: "redlock.io",
        version: "v1beta1",
        plural: "distributedlocks",
        kind: "DistributedLock",
        status: true,
        generation: true,
        unconditional_update: false,
        special: Special::Custom,
        ..BASE
    },
    Kind {
        group: "redlock.io",
        version: "v1beta1",
        plural: "redisquorums",
        kind: "RedisQuorum",
        namespaced: false,
        status: true,
        generation: true,
        unconditional_update: false,
        special: Special::Custom,
        ..BASE
    },
    // Stored, and evaluated on every create and update (admission.rs).
    Kind {
        group: "admissionregistration.k8s.io",
        plural: "validatingadmissionpolicies",
        kind: "ValidatingAdmissionPolicy",
        namespaced: false,
        status: true,
        generation: true,
        unconditional_update: false,
        ..BASE
    },
    Kind {
        group: "admissionregistration.k8s.io",
        plural: "validatingadmissionpolicybindings",
        kind: "ValidatingAdmissionPolicyBinding",
        namespaced: false,
        generation: true,
        unconditional_update: false,
        ..BASE
    },
    Kind {
        group: "apiextensions.k8s.io",
        plural: "customresourcedefinitions",
        kind: "CustomResourceDefinition",
        namespaced: false,
        status: true,
        generation: true,
        unconditional_update: false,
        special: Special::Crd,
        ..BASE
    },
];

impl Kind {
    /// `name.group`, or `name` for the core group.
    fn grouped(&self, name: &str) -> String {
        if self.group.is_empty() {
            name.to_owned()
        } else {
            format!("{name}.{}", self.group)
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group`, as error messages name the resource.
    pub fn qualified(&self) -> String {
        self.grouped(self.plural)
    }

    pub fn qualified_kind(&self) -> String {
        self.grouped(self.kind)
    }

    pub fn is_custom(&self) -> bool {
        self.special == Special::Custom
    }

    /// Status writes change nothing but status (custom resources and CRDs reset all metadata too).
    pub fn status_only_status(&self) -> bool {
        matches!(self.special, Special::Custom | Special::Crd)
    }

    pub fn crd_name(&self) -> String {
        self.qualified()
    }
}

/// The kind served at `group`/`version`/`plural`.
pub(super) fn find(group: &str, version: &str, plural: &str) -> Option<&'static Kind> {
    KINDS
        .iter()
        .find(|k| k.group == group && k.version == version && k.plural == plural)
}

/// The kind with `special`'s strategy (one per strategy but `Plain` and `Custom`).
pub(super) fn kind_of(special: Special) -> &'static Kind {
    KINDS
        .iter()
        .find(|k| k.special == special)
        .expect("kind in the table")
}
