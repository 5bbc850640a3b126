// SPDX-License-Identifier: Apache-2.0
//! Field-level validation errors, printed the way apimachinery's `field.Error` prints them
//! (`iptables.masqueradeBit: Invalid value: 32: must be within the range [0, 31]`), with
//! paths in the file's own (v1alpha1, camelCase) spelling.

use std::fmt;

use super::duration::{Duration, go_quote};

/// The offending value, kept in the shape Go formats it: strings quoted, numbers bare,
/// string lists as a Go slice literal.
#[derive(Clone, Debug, PartialEq)]
pub enum BadValue {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    StrList(Vec<String>),
}

impl fmt::Display for BadValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadValue::Str(value) => f.write_str(&go_quote(value)),
            BadValue::Int(value) => write!(f, "{value}"),
            BadValue::Float(value) => write!(f, "{value}"),
            BadValue::Bool(value) => write!(f, "{value}"),
            BadValue::StrList(values) => {
                let items: Vec<String> = values.iter().map(|v| go_quote(v)).collect();
                write!(f, "[]string{{{}}}", items.join(", "))
            }
        }
    }
}

impl From<&str> for BadValue {
    fn from(value: &str) -> Self {
        BadValue::Str(value.to_owned())
    }
}

impl From<&String> for BadValue {
    fn from(value: &String) -> Self {
        BadValue::Str(value.clone())
    }
}

impl From<String> for BadValue {
    fn from(value: String) -> Self {
        BadValue::Str(value)
    }
}

impl From<i32> for BadValue {
    fn from(value: i32) -> Self {
        BadValue::Int(i64::from(value))
    }
}

impl From<i64> for BadValue {
    fn from(value: i64) -> Self {
        BadValue::Int(value)
    }
}

impl From<u32> for BadValue {
    fn from(value: u32) -> Self {
        BadValue::Int(i64::from(value))
    }
}

impl From<f32> for BadValue {
    fn from(value: f32) -> Self {
        BadValue::Float(f64::from(value))
    }
}

impl From<bool> for BadValue {
    fn from(value: bool) -> Self {
        BadValue::Bool(value)
    }
}

/// Go prints a `metav1.Duration` through its `String()` method, quoted.
impl From<Duration> for BadValue {
    fn from(value: Duration) -> Self {
        BadValue::Str(value.to_string())
    }
}

impl From<&[String]> for BadValue {
    fn from(values: &[String]) -> Self {
        BadValue::StrList(values.to_vec())
    }
}

/// apimachinery's error types that this configuration uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorType {
    Invalid,
    NotSupported,
    Duplicate,
    Required,
    Forbidden,
}

impl ErrorType {
    fn label(self) -> &'static str {
        match self {
            ErrorType::Invalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Required => "Required value",
            ErrorType::Forbidden => "Forbidden",
        }
    }
}

/// One bad field: where (`field`, e.g. `ipvs.excludeCIDRs[1]`), what kind of problem, the
/// offending value (absent for Required/Forbidden) and a human explanation.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub error_type: ErrorType,
    pub bad_value: Option<BadValue>,
    pub detail: String,
}

impl FieldError {
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<BadValue>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            field: field.into(),
            error_type: ErrorType::Invalid,
            bad_value: Some(value.into()),
            detail: detail.into(),
        }
    }

    /// The value is not one of `supported`; the detail lists them quoted, as Go does.
    pub fn not_supported(
        field: impl Into<String>,
        value: impl Into<BadValue>,
        supported: &[&str],
    ) -> Self {
        let quoted: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
        FieldError {
            field: field.into(),
            error_type: ErrorType::NotSupported,
            bad_value: Some(value.into()),
            detail: format!("supported values: {}", quoted.join(", ")),
        }
    }

    pub fn duplicate(field: impl Into<String>, value: impl Into<BadValue>) -> Self {
        FieldError {
            field: field.into(),
            error_type: ErrorType::Duplicate,
            bad_value: Some(value.into()),
            detail: String::new(),
        }
    }

    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            error_type: ErrorType::Required,
            bad_value: None,
            detail: detail.into(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            error_type: ErrorType::Forbidden,
            bad_value: None,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.error_type.label())?;
        if let Some(value) = &self.bad_value {
            write!(f, ": {value}")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for FieldError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_like_apimachinery() {
        assert_eq!(
            FieldError::invalid(
                "oomScoreAdj",
                2000,
                "must be within the range [-1000, 1000]"
            )
            .to_string(),
            "oomScoreAdj: Invalid value: 2000: must be within the range [-1000, 1000]"
        );
        assert_eq!(
            FieldError::invalid(
                "iptables.syncPeriod",
                Duration::from_secs(40),
                "must be greater than 0"
            )
            .to_string(),
            r#"iptables.syncPeriod: Invalid value: "40s": must be greater than 0"#
        );
        assert_eq!(
            FieldError::not_supported("detectLocalMode", "x", &["A", ""]).to_string(),
            r#"detectLocalMode: Unsupported value: "x": supported values: "A", """#
        );
        assert_eq!(
            FieldError::duplicate("ebpf.devices[1]", "eth0").to_string(),
            r#"ebpf.devices[1]: Duplicate value: "eth0""#
        );
        assert_eq!(
            FieldError::forbidden("logging.vmodule", "only supported for text log format")
                .to_string(),
            "logging.vmodule: Forbidden: only supported for text log format"
        );
        assert_eq!(
            FieldError::required("kind", "").to_string(),
            "kind: Required value"
        );
        let list = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(
            FieldError::invalid("x", list.as_slice(), "bad").to_string(),
            r#"x: Invalid value: []string{"a", "b"}: bad"#
        );
        assert_eq!(
            FieldError::invalid("q", 2.5f32, "d").to_string(),
            "q: Invalid value: 2.5: d"
        );
        assert_eq!(
            FieldError::invalid("b", true, "d").to_string(),
            "b: Invalid value: true: d"
        );
    }
}
