"""Bokeh charts in an HTML page, drawn by BokehJS over a still PNG of them.

A standalone file carries BokehJS inline, so it opens offline; a notebook's fragment leaves it out
(BokehJS is 1.3 MB) and draws with the page's, which the perfmagic server extension serves once per
page. Where no script may run (an untrusted notebook, a viewer, an ``nbconvert`` export) the PNG
shows instead.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any


def bokeh_loader() -> str:
    """A script that defines BokehJS (inline, no CDN) unless this page already has this version."""
    from bokeh import __version__ as version
    from bokeh.resources import Resources

    code = "\n".join(Resources(mode="inline", components=["bokeh"]).js_raw)
    return (
        f'<script type="text/javascript">if(!(window.Bokeh&&window.Bokeh["{version}"])){{\n'
        f"{code}\n}}</script>"
    )


def charts_html(layout: Any, png: bytes | None = None, *, inline_bokehjs: bool = False) -> str:
    """The charts, drawn by BokehJS over a still PNG of them that stays where no script runs.

    ``inline_bokehjs`` carries BokehJS along (a standalone file); without it the page's BokehJS
    draws, loaded once per page from the perfmagic server extension when the page has none yet
    (a notebook: so a notebook does not keep a copy of BokehJS per report).
    """
    if layout is None:
        return ""
    from bokeh import __version__ as version
    from bokeh.embed import json_item

    target = f"pm-{uuid.uuid4().hex}"
    item = json.dumps(json_item(layout)).replace("</", "<\\/")  # never ends the script early
    still = (
        f'<img id="{target}-png" alt="perfmagic charts" style="max-width:100%" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        if png
        else ""
    )
    # the chart's JSON last: it may hold any text, "TARGET" included
    script = _EMBED_JS.replace("TARGET", target, 1).replace("VERSION", version, 1).replace("ITEM", item, 1)
    loader = bokeh_loader() if inline_bokehjs else ""
    return f'{loader}<div class="pm-charts">{still}<div id="{target}"></div></div><script>{script}</script>'


# Draws the charts once BokehJS is there: the page's, else bokeh.min.js from the perfmagic server
# extension (one request per page, shared by every report), then hides the still picture. Where that
# fails (no Jupyter server, an untrusted output: no script runs at all) the PNG stays.
_EMBED_JS = (
    "(function(){var item=ITEM,id='TARGET',v='VERSION';"
    "function bk(){var b=window.Bokeh;return b&&(b[v]||(b.version===v?b:null))}"
    "function load(){if(bk())return Promise.resolve();"
    "var c=document.getElementById('jupyter-config-data');if(!c)return Promise.reject(new Error('no server'));"
    "if(!window._perfmagicBokehJS){window._perfmagicBokehJS=new Promise(function(ok,no){"
    "var s=document.createElement('script');"
    "s.src=JSON.parse(c.textContent).baseUrl.replace(/\\/?$/,'/')+'perfmagic/static/bokeh.min.js?v='+v;"
    "s.onload=ok;s.onerror=no;document.head.appendChild(s)})}return window._perfmagicBokehJS}"
    "load().then(function(){return bk().embed.embed_item(item,id)}).then(function(){"
    "var p=document.getElementById(id+'-png');if(p)p.style.display='none'})"
    ".catch(function(e){console.info('perfmagic: static charts ('+e+')')})})();"
)
