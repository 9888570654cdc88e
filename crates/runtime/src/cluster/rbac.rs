//! RBAC rules in one shape: what the webhook's caches and the controller need, as the code
//! declares them. The installation renders its ClusterRoles and Roles from these, and the tests
//! check every call the components make against them.

/// One RBAC rule: `verbs` on `resource` of the API `group`, for the objects named in `names`
/// (`resourceNames`; empty: any name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RbacRule {
    /// The API group (`""`: the core group).
    pub group: &'static str,
    /// The resource, or `resource/subresource` (`pods/eviction`).
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub names: &'static [&'static str],
}

/// The verbs of a reflector: list, watch, and get.
pub const READ: &[&str] = &["get", "list", "watch"];

impl RbacRule {
    /// `verbs` on every object of `resource`.
    pub const fn new(
        group: &'static str,
        resource: &'static str,
        verbs: &'static [&'static str],
    ) -> Self {
        Self {
            group,
            resource,
            verbs,
            names: &[],
        }
    }

    /// The same rule, for the objects named `names` only.
    pub const fn named(self, names: &'static [&'static str]) -> Self {
        Self { names, ..self }
    }

    /// Whether the rule allows `verb` on `resource` of `group`, on the object `name` (`None`:
    /// a request that names no object, such as a list or a create).
    pub fn allows(&self, group: &str, resource: &str, verb: &str, name: Option<&str>) -> bool {
        self.group == group
            && self.resource == resource
            && self.verbs.contains(&verb)
            && (self.names.is_empty() || name.is_some_and(|name| self.names.contains(&name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_rule_allows_only_its_objects() {
        let any = RbacRule::new("coordination.k8s.io", "leases", &["create"]);
        assert!(any.allows("coordination.k8s.io", "leases", "create", None));
        assert!(!any.allows("coordination.k8s.io", "leases", "update", None));
        assert!(!any.allows("", "leases", "create", None));
        let own = RbacRule::new("coordination.k8s.io", "leases", &["get"]).named(&["mine"]);
        assert!(own.allows("coordination.k8s.io", "leases", "get", Some("mine")));
        assert!(!own.allows("coordination.k8s.io", "leases", "get", Some("theirs")));
        assert!(!own.allows("coordination.k8s.io", "leases", "get", None));
    }
}
