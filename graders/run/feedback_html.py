"""nbgrader's feedback page (generate_feedback's HTMLExporter) without nbconvert's second pass.

nbconvert's HTMLExporter renders the page, then parses the whole of it again with BeautifulSoup's
pure-Python parser to give each `<img>` without an `alt` a default one and, in JupyterLab-style
pages, to make inputs and outputs focusable. For a feedback page (about 310 KB: inlined CSS,
highlighted code, the figures) that pass took 0.73 s of a notebook's 1.5 s of feedback, as long as
rendering it (2026-12-06, 2-core machine; benchmarks/RESULTS.md, "Grading speed").

`FeedbackHTMLExporter` renders the same page and adds the same `alt` with one scan of the `<img>`
tags. It also keeps the Jinja templates it compiles (nbconvert's and nbgrader's, 0.3 s of each
page: every exporter builds a Jinja environment of its own) in this process's memory, so the
grading processes forked from a server that rendered one page (graders/run/preload.py) compile
none. nbgrader's feedback template is the classic one, whose page holds none of the elements the
focus step looks for; a page that does (an instructor's JupyterLab-style template) is rendered
again by HTMLExporter itself, as is every page under an nbconvert other than 7.x. The page
differs from nbconvert's only in how BeautifulSoup would re-serialize it
(tests/graders/test_feedback_html.py parses both and compares).

    cfg.GenerateFeedback.exporter_class = FeedbackHTMLExporter     (graders/run/pipeline.py)
"""

from __future__ import annotations

import copy
import re

import jinja2
from nbconvert.exporters import HTMLExporter, TemplateExporter

# what HTMLExporter writes into an <img> that has no alt
DEFAULT_ALT = "No description has been provided for this image"
# text that Python's HTML parser (BeautifulSoup's "html.parser", nbconvert's) does not read as
# tags, left as it is: scripts, style sheets and comments; or an <img ...> start tag (attribute
# values may hold ">" only when quoted)
_RAW_OR_IMG = re.compile(
    r"""(<script\b.*?</script\s*>|<style\b.*?</style\s*>|<!--.*?-->)"""
    r"""|(<img\b(?:[^>"']|"[^"]*"|'[^']*')*>)""",
    re.IGNORECASE | re.DOTALL,
)
_QUOTED = re.compile(r""""[^"]*"|'[^']*'""")
_ALT_NAME = re.compile(r"(?<=\s)alt(?=[\s=/>])", re.IGNORECASE)  # in a tag, quoted values emptied
# the classes HTMLExporter's focus step selects (JupyterLab's page structure)
_LAB_PAGE = re.compile(r"jp-Cell-inputWrapper|jp-OutputArea-output")


class _CompiledTemplates(jinja2.BytecodeCache):
    """Jinja's compiled templates in a dict of this process, keyed by template and checked
    against its source (a changed template is compiled again)."""

    def __init__(self) -> None:
        self._store: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        data = self._store.get(bucket.key)
        if data is not None:
            bucket.bytecode_from_string(data)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self._store[bucket.key] = bucket.bytecode_to_string()


COMPILED = _CompiledTemplates()


def _with_alt(tag: str) -> str:
    if _ALT_NAME.search(_QUOTED.sub('""', tag)):
        return tag
    end = -2 if tag.endswith("/>") else -1
    return f'{tag[:end].rstrip()} alt="{DEFAULT_ALT}"{tag[end:]}'


def add_missing_alt(html: str) -> str:
    """`html` with `alt="<DEFAULT_ALT>"` added to every `<img>` tag that has no alt (not to
    "<img" inside a script, a style sheet or a comment, which are not tags)."""
    return _RAW_OR_IMG.sub(lambda m: m.group(1) or _with_alt(m.group(2)), html)


class FeedbackHTMLExporter(HTMLExporter):
    """HTMLExporter that adds the missing alt text without parsing the rendered page again,
    its templates compiled once a process."""

    def _create_environment(self):
        environment = super()._create_environment()
        environment.bytecode_cache = COMPILED
        return environment

    def from_notebook_node(self, nb, resources=None, **kw):
        try:  # what HTMLExporter.from_notebook_node sets up before it renders (nbconvert 7.x)
            from nbconvert.filters.highlight import Highlight2HTML
            from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

            init_resources, nb_metadata = self._init_resources, self._nb_metadata
        except (ImportError, AttributeError):  # another nbconvert: its own way, as it is
            return super().from_notebook_node(nb, resources, **kw)
        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        highlight_code = self.filters.get(
            "highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self)
        )
        given = copy.deepcopy(resources)  # for a second render, as it came
        resources = init_resources(resources)
        filter_data_type = WidgetsDataTypeFilter(
            notebook_metadata=nb_metadata, parent=self, resources=resources
        )
        self.register_filter("highlight_code", highlight_code)
        self.register_filter("filter_data_type", filter_data_type)
        html, out = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        if _LAB_PAGE.search(html):  # a JupyterLab-style template: rendered again, as nbconvert does
            return super().from_notebook_node(nb, given, **kw)
        return add_missing_alt(html), out
