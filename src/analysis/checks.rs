//! Findings from statistics: NaN and Inf, dead or constant tensors, implausible magnitudes, and
//! tensors that stand out from the same tensor in the other layers.

use super::Moments;
use crate::finding::{Code, Finding};
use crate::format::Dtype;
use crate::text::is_numeric_part;
use std::cmp::Ordering;

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

/// What [`layer_outliers`] compares of a tensor: the spread and the largest magnitude of its
/// finite values. Kept instead of the whole [`Moments`] until every tensor is scanned, in single
/// precision: the comparison is by a factor of ten, the findings show five digits, and a model
/// can have a million tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub std: f32,
    pub absmax: f32,
}

impl Spread {
    /// Stands for no spread where a list holds one per tensor; [`Spread::of`] never gives it.
    pub const NONE: Spread = Spread {
        std: f32::NAN,
        absmax: f32::NAN,
    };

    pub fn is_none(&self) -> bool {
        self.std.is_nan()
    }

    #[expect(
        clippy::cast_possible_truncation,
        reason = "single precision on purpose; past its range is infinity"
    )]
    pub fn of(moments: &Moments) -> Option<Spread> {
        Some(Spread {
            std: moments.std().filter(|std| !std.is_nan())? as f32,
            absmax: moments.absmax()? as f32,
        })
    }
}

/// The name with each numeric part replaced by `*`: the same tensor in every layer
/// (`model.layers.*.mlp.down_proj.weight`); `None` for a name without a numeric part.
pub fn layer_pattern(name: &str) -> Option<String> {
    has_numeric_part(name).then(|| {
        let parts: Vec<&str> = pattern_parts(name).collect();
        parts.join(".")
    })
}

fn has_numeric_part(name: &str) -> bool {
    name.split('.').any(is_numeric_part)
}

fn pattern_parts(name: &str) -> impl Iterator<Item = &str> {
    name.split('.')
        .map(|part| if is_numeric_part(part) { "*" } else { part })
}

/// Orders names as their [`layer_pattern`]s order, without making the patterns.
fn pattern_cmp(a: &str, b: &str) -> Ordering {
    let bytes = |name| {
        pattern_parts(name)
            .enumerate()
            .flat_map(|(i, part)| (if i == 0 { "" } else { "." }).bytes().chain(part.bytes()))
    };
    bytes(a).cmp(bytes(b))
}

/// Tensors whose std or absmax is far from the median of the same tensor in the other layers,
/// each handed to `emit` as it is found: group after group in pattern order, a group's tensors in
/// the order of their ids. `name_of` and `spread_of` give each tensor's name and statistics; no
/// more than an id is held per tensor, as a hostile model can have a million.
pub fn layer_outliers<'a>(
    tensors: impl IntoIterator<Item = u32>,
    name_of: impl Fn(u32) -> &'a str,
    spread_of: impl Fn(u32) -> Spread,
    limits: &Limits,
    mut emit: impl FnMut(Finding),
) {
    let mut layered: Vec<u32> = tensors
        .into_iter()
        .filter(|&tensor| has_numeric_part(name_of(tensor)))
        .collect();
    layered.sort_unstable_by(|&a, &b| pattern_cmp(name_of(a), name_of(b)).then(a.cmp(&b)));
    let mut values: Vec<f32> = Vec::new();
    let same_group = |&a: &u32, &b: &u32| pattern_cmp(name_of(a), name_of(b)) == Ordering::Equal;
    for members in layered.chunk_by(same_group) {
        if members.len() < 3 {
            continue;
        }
        let mut median = |pick: fn(&Spread) -> f32| {
            values.clear();
            values.extend(members.iter().map(|&tensor| pick(&spread_of(tensor))));
            let middle = values.len() / 2;
            f64::from(*values.select_nth_unstable_by(middle, f32::total_cmp).1)
        };
        let (median_std, median_absmax) = (median(|s| s.std), median(|s| s.absmax));
        let pattern = layer_pattern(name_of(members[0])).unwrap_or_default();
        for &tensor in members {
            let spread = spread_of(tensor);
            for (what, value, median) in [
                ("std", f64::from(spread.std), median_std),
                ("absmax", f64::from(spread.absmax), median_absmax),
            ] {
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
                        .for_tensor(name_of(tensor)),
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
        let mut findings = Vec::new();
        layer_outliers(
            0..5,
            |i| names[i as usize].as_str(),
            |i| Spread::of(if i == 3 { &wild } else { &normal }).unwrap(),
            &Limits::default(),
            |f| findings.push(f),
        );
        assert_eq!(findings.len(), 1);
        assert_eq!(findings[0].tensor.as_deref(), Some("layers.3.w"));
    }
}
