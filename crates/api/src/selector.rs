//! Evaluating a Kubernetes `LabelSelector` (`matchLabels` and
//! `matchExpressions`) against a set of labels, as the API reference defines
//! it: every requirement must hold; an empty selector selects everything.
//! Pure, for the agent's policy compilers (SecurityGroup `podSelector`,
//! NetworkPolicy selectors).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A selector that cannot be evaluated: it selects nothing, and the caller
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// An operator other than In, NotIn, Exists, DoesNotExist.
    #[error("unknown operator {operator:?} for key {key:?}")]
    UnknownOperator {
        /// The requirement's key.
        key: String,
        /// The operator.
        operator: String,
    },
    /// In/NotIn without values, or Exists/DoesNotExist with values.
    #[error("operator {operator} for key {key:?} {problem}")]
    BadValues {
        /// The requirement's key.
        key: String,
        /// The operator.
        operator: String,
        /// What is wrong.
        problem: &'static str,
    },
}

/// Does `selector` select an object with `labels`?
pub fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut matched = true;
    for (k, v) in selector.match_labels.iter().flatten() {
        matched &= labels.get(k) == Some(v);
    }
    for req in selector.match_expressions.iter().flatten() {
        let values = req.values.as_deref().unwrap_or_default();
        let have = labels.get(&req.key);
        let bad = |problem| SelectorError::BadValues {
            key: req.key.clone(),
            operator: req.operator.clone(),
            problem,
        };
        let ok = match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => return Err(bad("needs values")),
            "Exists" | "DoesNotExist" if !values.is_empty() => return Err(bad("takes no values")),
            "In" => have.is_some_and(|h| values.contains(h)),
            "NotIn" => !have.is_some_and(|h| values.contains(h)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            other => {
                return Err(SelectorError::UnknownOperator {
                    key: req.key.clone(),
                    operator: other.to_string(),
                })
            }
        };
        matched &= ok;
    }
    Ok(matched)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).into()).collect()),
        }
    }

    #[test]
    fn empty_selects_all_and_every_requirement_must_hold() {
        let web = labels(&[("app", "web"), ("tier", "front")]);
        assert!(selector_matches(&LabelSelector::default(), &web).unwrap());
        assert!(selector_matches(&LabelSelector::default(), &labels(&[])).unwrap());
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![expr("tier", "In", &["front", "edge"])]),
        };
        assert!(selector_matches(&sel, &web).unwrap());
        assert!(!selector_matches(&sel, &labels(&[("app", "web"), ("tier", "back")])).unwrap());
        assert!(!selector_matches(&sel, &labels(&[("tier", "front")])).unwrap());
    }

    #[test]
    fn operators_follow_the_api_reference() {
        let l = labels(&[("a", "1")]);
        let one = |e| LabelSelector {
            match_expressions: Some(vec![e]),
            ..LabelSelector::default()
        };
        assert!(selector_matches(&one(expr("a", "Exists", &[])), &l).unwrap());
        assert!(!selector_matches(&one(expr("b", "Exists", &[])), &l).unwrap());
        assert!(selector_matches(&one(expr("b", "DoesNotExist", &[])), &l).unwrap());
        assert!(!selector_matches(&one(expr("a", "NotIn", &["1"])), &l).unwrap());
        // NotIn matches an absent key
        assert!(selector_matches(&one(expr("b", "NotIn", &["1"])), &l).unwrap());
        assert!(matches!(
            selector_matches(&one(expr("a", "In", &[])), &l),
            Err(SelectorError::BadValues { .. })
        ));
        assert!(matches!(
            selector_matches(&one(expr("a", "Exists", &["x"])), &l),
            Err(SelectorError::BadValues { .. })
        ));
        assert!(matches!(
            selector_matches(&one(expr("a", "Gt", &["0"])), &l),
            Err(SelectorError::UnknownOperator { .. })
        ));
    }
}
