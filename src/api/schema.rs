//! What the CRD schemas need beyond schemars' defaults to read well in `kubectl explain`.

use schemars::Schema;
use schemars::transform::transform_subschemas;

/// A schemars transform for the roots of `spec` and `status`: every description below puts each paragraph on
/// one line. schemars keeps a doc comment's line breaks, which sit wherever rustfmt wrapped the comment, and
/// `kubectl explain` shows them as they are: in mid-sentence.
pub fn one_line_paragraphs(schema: &mut Schema) {
    if let Some(serde_json::Value::String(description)) = schema.get_mut("description") {
        *description = unwrap_paragraphs(description);
    }
    transform_subschemas(&mut one_line_paragraphs, schema);
}

/// `text` with the lines of each paragraph joined by a space. Blank lines between paragraphs are kept (as one),
/// and so is the break before a list item (`- `, `* `, `1. `).
fn unwrap_paragraphs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut paragraph_ended = false;
    for line in text.lines().map(str::trim) {
        if line.is_empty() {
            paragraph_ended = !out.is_empty();
            continue;
        }
        if paragraph_ended {
            out.push_str("\n\n");
            paragraph_ended = false;
        } else if !out.is_empty() {
            out.push(if starts_list_item(line) { '\n' } else { ' ' });
        }
        out.push_str(line);
    }
    out
}

fn starts_list_item(line: &str) -> bool {
    line.starts_with("- ")
        || line.starts_with("* ")
        || line
            .split_once(". ")
            .is_some_and(|(number, _)| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paragraphs_become_one_line_each() {
        assert_eq!(
            unwrap_paragraphs("Two locks naming the same key\n  contend for one lock."),
            "Two locks naming the same key contend for one lock."
        );
        assert_eq!(
            unwrap_paragraphs("First paragraph,\nwrapped.\n\n\nSecond one.\n"),
            "First paragraph, wrapped.\n\nSecond one."
        );
        assert_eq!(
            unwrap_paragraphs("Either:\n- one,\n  wrapped\n- two\n10. ten"),
            "Either:\n- one, wrapped\n- two\n10. ten"
        );
        assert_eq!(unwrap_paragraphs("One line."), "One line.");
    }

    #[test]
    fn the_transform_reaches_nested_schemas() {
        let mut schema = schemars::json_schema!({
            "description": "a\nb",
            "properties": {
                "x": { "description": "c\nd", "items": { "description": "e\nf" } }
            }
        });
        one_line_paragraphs(&mut schema);
        assert_eq!(schema.get("description"), Some(&"a b".into()));
        let x = &schema.as_value()["properties"]["x"];
        assert_eq!(x["description"], "c d");
        assert_eq!(x["items"]["description"], "e f");
    }
}
