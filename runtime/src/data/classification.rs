//! Labelled examples for classification: digits (CSV, optionally gzipped), generic CSV, libsvm.

use std::collections::BTreeSet;
use std::path::Path;

use super::{DataError, for_each_line, split_indices};

/// Dense labelled examples: `features[i * num_features..][..num_features]` is example `i`.
#[derive(Debug, Clone, PartialEq)]
pub struct Examples {
    /// Features per example.
    pub num_features: usize,
    /// Number of classes; labels are `0..num_classes`.
    pub num_classes: usize,
    /// Row-major feature matrix.
    pub features: Vec<f32>,
    /// Class of each example.
    pub labels: Vec<u32>,
    /// The original label of each class (class `c` was written as `class_labels[c]`).
    pub class_labels: Vec<i64>,
}

impl Examples {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True if there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Features of example `index`.
    pub fn row(&self, index: usize) -> &[f32] {
        &self.features[index * self.num_features..(index + 1) * self.num_features]
    }

    /// The examples at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Examples {
        let mut features = Vec::with_capacity(indices.len() * self.num_features);
        for &index in indices {
            features.extend_from_slice(self.row(index));
        }
        Examples {
            num_features: self.num_features,
            num_classes: self.num_classes,
            features,
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            class_labels: self.class_labels.clone(),
        }
    }

    /// Seeded (train, test) split.
    pub fn split(&self, test_fraction: f64, seed: u64) -> Result<(Examples, Examples), DataError> {
        let (train, test) = split_indices(self.len(), test_fraction, seed)?;
        Ok((self.select(&train), self.select(&test)))
    }

    /// Multiplies every feature by `factor` (e.g. `1/16` for digits' 0..16 pixel values).
    pub fn scale(&mut self, factor: f32) {
        self.features.iter_mut().for_each(|v| *v *= factor);
    }

    /// Largest absolute feature value (0 if empty), to scale features into `[-1, 1]`.
    pub fn max_abs(&self) -> f32 {
        self.features.iter().fold(0.0, |m, v| m.max(v.abs()))
    }
}

/// Where the label sits in a CSV line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelColumn {
    /// First field.
    First,
    /// Last field.
    Last,
}

/// Maps raw integer labels onto classes `0..n` in sorted order of the distinct labels.
fn classes_from_raw(raw: &[i64]) -> (Vec<u32>, Vec<i64>) {
    let distinct: Vec<i64> = raw
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let labels = raw
        .iter()
        .map(|label| distinct.binary_search(label).unwrap_or(0) as u32)
        .collect();
    (labels, distinct)
}

fn parse_label(path: &Path, line: usize, field: &str) -> Result<i64, DataError> {
    let field = field.trim();
    field
        .parse::<i64>()
        .ok()
        .or_else(|| {
            field
                .parse::<f64>()
                .ok()
                .filter(|v| v.fract() == 0.0 && v.abs() < 1e15)
                .map(|v| v as i64)
        })
        .ok_or_else(|| DataError::parse(path, line, "an integer class label", field))
}

/// Loads comma-separated numeric features with an integer label in `label` position; `header`
/// skips the first line. Every line must have the same number of fields. `*.gz` is gunzipped.
pub fn load_csv(path: &Path, label: LabelColumn, header: bool) -> Result<Examples, DataError> {
    let mut width: Option<usize> = None;
    let mut features = Vec::new();
    let mut raw_labels = Vec::new();
    for_each_line(path, |line_number, line| {
        if (header && line_number == 1) || line.trim().is_empty() {
            return Ok(());
        }
        let fields: Vec<&str> = line.split(',').collect();
        let expected = *width.get_or_insert(fields.len());
        if fields.len() != expected || expected < 2 {
            return Err(DataError::parse(
                path,
                line_number,
                format!(
                    "{} comma-separated fields (features and a label)",
                    expected.max(2)
                ),
                line,
            ));
        }
        let (label_field, feature_fields) = match label {
            LabelColumn::First => (fields[0], &fields[1..]),
            LabelColumn::Last => (fields[expected - 1], &fields[..expected - 1]),
        };
        raw_labels.push(parse_label(path, line_number, label_field)?);
        for field in feature_fields {
            let value: f32 = field
                .trim()
                .parse()
                .ok()
                .filter(|v: &f32| v.is_finite())
                .ok_or_else(|| DataError::parse(path, line_number, "a finite number", field))?;
            features.push(value);
        }
        Ok(())
    })?;
    let Some(width) = width else {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            expected: "CSV examples".into(),
        });
    };
    let (labels, class_labels) = classes_from_raw(&raw_labels);
    Ok(Examples {
        num_features: width - 1,
        num_classes: class_labels.len(),
        features,
        labels,
        class_labels,
    })
}

/// Loads scikit-learn's `digits.csv.gz`: 64 pixel values (0..16) then the digit, per line.
pub fn load_digits(path: &Path) -> Result<Examples, DataError> {
    let examples = load_csv(path, LabelColumn::Last, false)?;
    if examples.num_features != 64 {
        return Err(DataError::parse(
            path,
            1,
            "64 pixel values and a label per line",
            &format!("{} fields", examples.num_features + 1),
        ));
    }
    Ok(examples)
}

/// Loads a libsvm/svmlight file: `label index:value …` with 1-based, increasing indices; `#`
/// starts a comment. Features are stored densely (`num_features` = largest index).
pub fn load_libsvm(path: &Path) -> Result<Examples, DataError> {
    let mut sparse: Vec<Vec<(usize, f32)>> = Vec::new();
    let mut raw_labels = Vec::new();
    let mut num_features = 0usize;
    for_each_line(path, |line_number, line| {
        let content = line.split('#').next().unwrap_or("");
        let mut parts = content.split_whitespace();
        let Some(label) = parts.next() else {
            return Ok(());
        };
        raw_labels.push(parse_label(path, line_number, label)?);
        let mut row = Vec::new();
        let mut previous = 0usize;
        for pair in parts {
            let parsed = pair.split_once(':').and_then(|(index, value)| {
                Some((index.parse::<usize>().ok()?, value.parse::<f32>().ok()?))
            });
            let Some((index, value)) =
                parsed.filter(|&(index, value)| index > previous && value.is_finite())
            else {
                return Err(DataError::parse(
                    path,
                    line_number,
                    "an index:value pair with a 1-based index above the previous one",
                    pair,
                ));
            };
            previous = index;
            num_features = num_features.max(index);
            row.push((index - 1, value));
        }
        sparse.push(row);
        Ok(())
    })?;
    if sparse.is_empty() {
        return Err(DataError::Empty {
            path: path.to_path_buf(),
            expected: "libsvm examples".into(),
        });
    }
    let mut features = vec![0.0; sparse.len() * num_features];
    for (example, row) in sparse.iter().enumerate() {
        for &(index, value) in row {
            features[example * num_features + index] = value;
        }
    }
    let (labels, class_labels) = classes_from_raw(&raw_labels);
    Ok(Examples {
        num_features,
        num_classes: class_labels.len(),
        features,
        labels,
        class_labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, content: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        (dir, path)
    }

    #[test]
    fn csv_with_label_first_or_last_and_header() {
        let (_dir, path) = write("a.csv", "f1,f2,y\n1,2,7\n3,4,5\n");
        let examples = load_csv(&path, LabelColumn::Last, true).unwrap();
        assert_eq!(examples.num_features, 2);
        assert_eq!(examples.labels, vec![1, 0]);
        assert_eq!(examples.class_labels, vec![5, 7]);
        assert_eq!(examples.row(1), &[3.0, 4.0]);
        let (_dir, path) = write("b.csv", "1,2,7\n0,4,5.0\n");
        let examples = load_csv(&path, LabelColumn::First, false).unwrap();
        assert_eq!(examples.class_labels, vec![0, 1]);
        assert_eq!(examples.row(0), &[2.0, 7.0]);
        let (train, test) = examples.split(0.5, 1).unwrap();
        assert_eq!(train.len() + test.len(), 2);
    }

    #[test]
    fn csv_errors_name_line_and_expectation() {
        for (content, expected) in [
            ("1,2,3\n1,2\n", "a.csv:2: expected 3 comma-separated fields"),
            ("1,x,3\n", "a.csv:1: expected a finite number"),
            ("1,2,3.5\n", "a.csv:1: expected an integer class label"),
        ] {
            let (_dir, path) = write("a.csv", content);
            let error = load_csv(&path, LabelColumn::Last, false)
                .unwrap_err()
                .to_string();
            assert!(error.contains(expected), "{error}");
        }
        let (_dir, path) = write("d.csv", "1,2,3\n");
        let error = load_digits(&path).unwrap_err().to_string();
        assert!(error.contains("expected 64 pixel values"), "{error}");
    }

    #[test]
    fn libsvm_is_densified_and_validated() {
        let (_dir, path) = write("a.svm", "+1 1:0.5 3:2 # comment\n-1 2:1\n\n");
        let examples = load_libsvm(&path).unwrap();
        assert_eq!(examples.num_features, 3);
        assert_eq!(examples.features, vec![0.5, 0.0, 2.0, 0.0, 1.0, 0.0]);
        assert_eq!(examples.labels, vec![1, 0]);
        let (_dir, path) = write("b.svm", "1 2:1 2:3\n");
        let error = load_libsvm(&path).unwrap_err().to_string();
        assert!(
            error.contains("b.svm:1: expected an index:value pair"),
            "{error}"
        );
    }
}
