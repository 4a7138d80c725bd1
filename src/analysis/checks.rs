//! Findings from statistics: NaN and Inf, dead or constant tensors, implausible magnitudes, and
//! tensors that stand out from the same tensor in the other layers.

use super::Moments;
use crate::finding::{Code, Finding};
use crate::format::Dtype;
use std::collections::BTreeMap;

/// Limits for the numeric findings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// A float weight with a value of larger magnitude is reported (`values-extreme`).
    pub extreme: f64,
    /// Values of larger magnitude look like uninitialised memory (`values-garbage`).
    pub garbage: f64,
    /// A tensor whose std or absmax differs from its layer siblings' median by more than this
    /// factor is an outlier (`layer-outlier`).
    pub outlier_ratio: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            extreme: 1e4,
            garbage: 1e30,
            outlier_ratio: 10.0,
        }
    }
}

/// What one tensor's statistics say about it.
pub fn tensor_findings(name: &str, dtype: Dtype, m: &Moments, limits: &Limits) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut add = |finding: Finding| findings.push(finding.for_tensor(name));
    if m.nan > 0 {
        add(Finding::error(
            Code::ValuesNan,
            format!("{} of {} values are NaN", m.nan, m.count),
        ));
    }
    if m.pos_inf + m.neg_inf > 0 {
        add(Finding::error(
            Code::ValuesInf,
            format!(
                "{} +Inf and {} -Inf among {} values",
                m.pos_inf, m.neg_inf, m.count
            ),
        ));
    }
    if m.count > 0 && m.zeros == m.count {
        add(Finding::warning(
            Code::ValuesAllZero,
            format!("all {} values are zero", m.count),
        ));
    } else if m.count > 1 && m.finite() == m.count && m.min == m.max {
        add(Finding::warning(
            Code::ValuesConstant,
            format!("all {} values are {}", m.count, m.min),
        ));
    }
    if dtype.is_float()
        && let Some(absmax) = m.absmax()
    {
        {
            if absmax > limits.garbage {
                add(Finding::error(
                    Code::ValuesGarbage,
                    format!("values reach {absmax:e}, which looks like uninitialised memory"),
                ));
            } else if absmax > limits.extreme && name.ends_with("weight") {
                add(Finding::warning(
                    Code::ValuesExtreme,
                    format!(
                        "values reach {absmax:e}, over the limit of {:e} for a weight",
                        limits.extreme
                    ),
                ));
            }
        }
    }
    findings
}

/// The name with each numeric part replaced by `*`: the same tensor in every layer
/// (`model.layers.*.mlp.down_proj.weight`).
/// What [`layer_outliers`] compares of a tensor: the spread and the largest magnitude of its
/// finite values. Kept instead of the whole [`Moments`] until every tensor is scanned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub std: f64,
    pub absmax: f64,
}

impl Spread {
    pub fn of(moments: &Moments) -> Option<Spread> {
        Some(Spread {
            std: moments.std()?,
            absmax: moments.absmax()?,
        })
    }
}

pub fn layer_pattern(name: &str) -> Option<String> {
    let mut numbered = false;
    let pattern: Vec<&str> = name
        .split('.')
        .map(|part| {
            if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
                numbered = true;
                "*"
            } else {
                part
            }
        })
        .collect();
    numbered.then(|| pattern.join("."))
}

/// Tensors whose std or absmax is far from the median of the same tensor in the other layers,
/// each handed to `emit` as it is found (a hostile model can have a million).
/// `tensors` holds each float tensor's name and statistics.
pub fn layer_outliers<'a>(
    tensors: impl IntoIterator<Item = (&'a str, Spread)>,
    limits: &Limits,
    mut emit: impl FnMut(Finding),
) {
    let mut groups: BTreeMap<String, Vec<(&str, f64, f64)>> = BTreeMap::new();
    for (name, spread) in tensors {
        if let Some(pattern) = layer_pattern(name) {
            groups
                .entry(pattern)
                .or_default()
                .push((name, spread.std, spread.absmax));
        }
    }
    for (pattern, members) in groups {
        if members.len() < 3 {
            continue;
        }
        let median = |pick: fn(&(&str, f64, f64)) -> f64| {
            let mut values: Vec<f64> = members.iter().map(pick).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        let (median_std, median_absmax) = (median(|m| m.1), median(|m| m.2));
        for &(name, std, absmax) in &members {
            for (what, value, median) in
                [("std", std, median_std), ("absmax", absmax, median_absmax)]
            {
                let ratio = if median > 0.0 { value / median } else { 1.0 };
                if ratio > limits.outlier_ratio || ratio < 1.0 / limits.outlier_ratio {
                    emit(
                        Finding::warning(
                            Code::LayerOutlier,
                            format!(
                                "{what} {value:.4e} is {ratio:.3}x the median {median:.4e} of `{pattern}` ({} layers)",
                                members.len()
                            ),
                        )
                        .for_tensor(name),
                    );
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(values: &[f32]) -> Moments {
        Moments::of_f32(values)
    }

    fn codes(findings: &[Finding]) -> Vec<&'static str> {
        findings.iter().map(|f| f.code.as_str()).collect()
    }

    #[test]
    fn flags_nan_inf_zero_constant_and_huge_values() {
        let limits = Limits::default();
        let check = |values: &[f32]| {
            codes(&tensor_findings(
                "a.weight",
                Dtype::F32,
                &stats(values),
                &limits,
            ))
        };
        assert_eq!(
            check(&[1.0, f32::NAN, f32::INFINITY]),
            ["values-nan", "values-inf"]
        );
        assert_eq!(check(&[0.0, 0.0]), ["values-all-zero"]);
        assert_eq!(check(&[2.5, 2.5, 2.5]), ["values-constant"]);
        assert_eq!(check(&[1.0, 2e4]), ["values-extreme"]);
        assert_eq!(check(&[1.0, 3e38]), ["values-garbage"]);
        assert!(check(&[0.1, -0.2, 0.3]).is_empty());
    }

    #[test]
    fn finds_the_layer_that_stands_out() {
        assert_eq!(
            layer_pattern("model.layers.12.mlp.w").as_deref(),
            Some("model.layers.*.mlp.w")
        );
        assert_eq!(layer_pattern("lm_head.weight"), None);
        let normal = stats(&[-0.02, 0.0, 0.02]);
        let wild = stats(&[-2.0, 0.0, 2.0]);
        let names: Vec<String> = (0..5).map(|i| format!("layers.{i}.w")).collect();
        let tensors: Vec<(&str, Spread)> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let moments = if i == 3 { &wild } else { &normal };
                (n.as_str(), Spread::of(moments).unwrap())
            })
            .collect();
        let mut findings = Vec::new();
        layer_outliers(tensors, &Limits::default(), |f| findings.push(f));
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].tensor.as_deref(), Some("layers.3.w"));
    }
}
