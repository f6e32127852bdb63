//! Which `content` a chat template expects, read from its syntax tree as the engines do.
//! "openai": the template reads content parts, and the engine hands it lists; "string":
//! the engine joins text parts into one string first. The two engines detect it differently.
//!
//! **SGLang** (sglang 0.5.23 `python/sglang/srt/parser/jinja_template_utils.py`,
//! `detect_jinja_template_content_format`): "openai" when the template's text contains
//! `image`, `audio`, `video` or `vision` anywhere, or when some `{% for x in m.content %}`
//! loop iterates over the `content` of a variable literally named `message`, `msg` or `m`
//! (through a filter, a test or a slice); "string" otherwise and for a template Jinja
//! cannot parse.
//!
//! **vLLM** (`vllm/entrypoints/chat_utils.py`, `_detect_content_format`): `messages` and
//! every variable assigned from it (`{% set msgs = messages[1:] %}`, followed through chains
//! of assignments) are message lists; the target of a loop over a message list is a
//! message; a loop over a message's `content` means "openai". A template that cannot be
//! parsed, or whose loop or assignment targets are not plain names, is "string".

use minijinja::machinery::ast::{Expr, Stmt};

/// The content format a template expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// `content` is a string: list contents are joined to text before rendering.
    String,
    /// `content` may be a list of parts: lists reach the template as they are.
    OpenAi,
}

/// The content format SGLang detects in a chat template's source.
pub fn detect_sglang(source: &str, syntax: minijinja::syntax::SyntaxConfig) -> ContentFormat {
    if ["image", "audio", "video", "vision"]
        .iter()
        .any(|media| source.contains(media))
    {
        return ContentFormat::OpenAi;
    }
    let Ok(root) = minijinja::machinery::parse(source, "chat_template", syntax) else {
        return ContentFormat::String;
    };
    let mut nodes = Nodes::default();
    nodes.stmt(&root);
    let over_content = nodes.loops.iter().any(|(_, iter)| {
        ["message", "msg", "m"]
            .iter()
            .any(|var| is_var_or_elems(iter, var, Some("content")))
    });
    if over_content {
        ContentFormat::OpenAi
    } else {
        ContentFormat::String
    }
}

/// The content format vLLM detects in a chat template's source.
pub fn detect_vllm(source: &str, syntax: minijinja::syntax::SyntaxConfig) -> ContentFormat {
    let Ok(root) = minijinja::machinery::parse(source, "chat_template", syntax) else {
        return ContentFormat::String;
    };
    let mut nodes = Nodes::default();
    nodes.stmt(&root);
    match nodes.reads_content_parts() {
        Some(true) => ContentFormat::OpenAi,
        Some(false) | None => ContentFormat::String,
    }
}

/// The loops and assignments of a template, in document order.
#[derive(Default)]
struct Nodes<'t, 'a> {
    /// `{% for target in iter %}`
    loops: Vec<(&'t Expr<'a>, &'t Expr<'a>)>,
    /// `{% set target = expr %}`
    sets: Vec<(&'t Expr<'a>, &'t Expr<'a>)>,
}

impl<'t, 'a> Nodes<'t, 'a> {
    fn stmts(&mut self, list: &'t [Stmt<'a>]) {
        list.iter().for_each(|s| self.stmt(s));
    }

    fn stmt(&mut self, stmt: &'t Stmt<'a>) {
        match stmt {
            Stmt::Template(t) => self.stmts(&t.children),
            Stmt::ForLoop(f) => {
                self.loops.push((&f.target, &f.iter));
                self.stmts(&f.body);
                self.stmts(&f.else_body);
            }
            Stmt::IfCond(i) => {
                self.stmts(&i.true_body);
                self.stmts(&i.false_body);
            }
            Stmt::WithBlock(w) => self.stmts(&w.body),
            Stmt::Set(s) => self.sets.push((&s.target, &s.expr)),
            Stmt::SetBlock(s) => self.stmts(&s.body),
            Stmt::AutoEscape(a) => self.stmts(&a.body),
            Stmt::FilterBlock(f) => self.stmts(&f.body),
            Stmt::Block(b) => self.stmts(&b.body),
            Stmt::Macro(m) => self.stmts(&m.body),
            Stmt::CallBlock(c) => self.stmts(&c.macro_decl.body),
            _ => {}
        }
    }

    /// Whether some loop iterates over a message's `content`; None where the engines' walk
    /// fails (a loop or assignment target that is not a plain name).
    fn reads_content_parts(&self) -> Option<bool> {
        // Every name that holds `messages` or part of it, following assignments.
        let mut lists: Vec<&str> = vec!["messages"];
        let mut i = 0;
        while i < lists.len() {
            let list = lists[i];
            for (target, expr) in &self.sets {
                if is_var_or_elems(expr, list, None) {
                    let name = name_of(target)?;
                    if !lists.contains(&name) {
                        lists.push(name);
                    }
                }
            }
            i += 1;
        }
        let mut messages: Vec<&str> = Vec::new();
        for (target, iter) in &self.loops {
            if lists.iter().any(|l| is_var_or_elems(iter, l, None)) {
                messages.push(name_of(target)?);
            }
        }
        for (target, iter) in &self.loops {
            if messages
                .iter()
                .any(|m| is_var_or_elems(iter, m, Some("content")))
            {
                name_of(target)?;
                return Some(true);
            }
        }
        Some(false)
    }
}

fn name_of<'a>(expr: &Expr<'a>) -> Option<&'a str> {
    match expr {
        Expr::Var(v) => Some(v.id),
        _ => None,
    }
}

/// `var`, or `var[key]` / `var.key` when a key is given, seen through filters, tests and
/// slices (`messages | selectattr(...)`, `message['content'] is string`, `messages[1:]`).
fn is_var_or_elems(expr: &Expr<'_>, var: &str, key: Option<&str>) -> bool {
    match expr {
        Expr::Filter(f) => f
            .expr
            .as_ref()
            .is_some_and(|e| is_var_or_elems(e, var, key)),
        Expr::Test(t) => is_var_or_elems(&t.expr, var, key),
        Expr::Slice(s) => is_var_or_elems(&s.expr, var, key),
        _ => match key {
            None => matches!(expr, Expr::Var(v) if v.id == var),
            Some(key) => is_attr(expr, var, key),
        },
    }
}

/// `var[key]` or `var.key`.
fn is_attr(expr: &Expr<'_>, var: &str, key: &str) -> bool {
    match expr {
        Expr::GetAttr(a) => a.name == key && matches!(&a.expr, Expr::Var(v) if v.id == var),
        Expr::GetItem(g) => {
            matches!(&g.expr, Expr::Var(v) if v.id == var)
                && matches!(&g.subscript_expr, Expr::Const(c) if c.value.as_str() == Some(key))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format_of(source: &str) -> ContentFormat {
        detect_vllm(source, Default::default())
    }

    #[test]
    fn loops_over_content_mean_openai_parts() {
        assert_eq!(
            format_of("{% for m in messages %}{% for c in m['content'] %}{{ c.text }}{% endfor %}{% endfor %}"),
            ContentFormat::OpenAi
        );
        assert_eq!(
            format_of("{% set msgs = messages[1:] %}{% set rest = msgs %}{% for m in rest %}{% for c in m.content | selectattr('type') %}x{% endfor %}{% endfor %}"),
            ContentFormat::OpenAi
        );
    }

    #[test]
    fn string_templates_and_broken_ones_are_string() {
        assert_eq!(
            format_of("{% for m in messages %}{{ m['content'] }}{% endfor %}"),
            ContentFormat::String
        );
        // A loop over some other variable's content is not a message's.
        assert_eq!(
            format_of("{% for c in tools['content'] %}{% endfor %}"),
            ContentFormat::String
        );
        assert_eq!(format_of("{% for %}"), ContentFormat::String);
    }

    #[test]
    fn sglang_looks_for_media_words_and_named_loops() {
        let sglang = |s: &str| detect_sglang(s, Default::default());
        assert_eq!(sglang("{{ 'image' }}"), ContentFormat::OpenAi);
        assert_eq!(
            sglang(
                "{% for msg in messages %}{% for c in msg['content'] %}{% endfor %}{% endfor %}"
            ),
            ContentFormat::OpenAi
        );
        // Another loop variable name is not seen by SGLang (vLLM sees it).
        let other = "{% for turn in messages %}{% for c in turn.content %}{% endfor %}{% endfor %}";
        assert_eq!(sglang(other), ContentFormat::String);
        assert_eq!(format_of(other), ContentFormat::OpenAi);
    }
}
