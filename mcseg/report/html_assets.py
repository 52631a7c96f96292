"""The style and script inlined into report.html (no file, font or library is fetched: the page works offline).

The script: every table sorts by a column when its header is clicked (numbers by the value they start with, the
rest as text; '–' and empty cells last; a second click reverses); the per-case view draws the chosen case's slice
as a stack of images, one per layer, the slider choosing the slice and each checkbox showing or hiding its layer;
the reliability diagrams show a bin's confidence, accuracy and voxel count in a tooltip on hover.
"""

STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; }
code { background: #f2f2f2; padding: 0 .2em; border-radius: 3px; font-size: .92em; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: .82em; margin: .6em 0; }
th, td { border: 1px solid #ccc; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f0f3f7; cursor: pointer; user-select: none; white-space: nowrap; position: sticky; top: 0; }
th[data-order="asc"]::after { content: " \\25B2"; } th[data-order="desc"]::after { content: " \\25BC"; }
tr:nth-child(even) td { background: #fafafa; }
figure { display: inline-block; margin: .5em 1em .5em 0; vertical-align: top; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: .8em; color: #555; }
.note { background: #fff6e0; border-left: 4px solid #e8a500; padding: .3em .6em; font-size: .9em; }
#viewer { display: flex; gap: 1.5em; flex-wrap: wrap; align-items: flex-start; }
#stack { position: relative; background: #000; }
#stack img { position: absolute; left: 0; top: 0; width: 100%; height: 100%; image-rendering: pixelated; }
#controls label { display: block; font-size: .9em; }
.swatch { display: inline-block; width: .9em; height: .9em; margin-right: .3em; vertical-align: middle; }
#tooltip { position: fixed; pointer-events: none; background: #222; color: #fff; font-size: .8em;
           padding: .2em .4em; border-radius: 3px; display: none; white-space: pre; }
#case-notes:empty { display: none; }
svg.reliability rect.bin:hover { fill: #d62728; }
"""

SCRIPT = r"""
(function () {
  'use strict';
  function key(text) {
    var t = text.trim();
    if (t === '' || t === '\u2013' || t === '-') { return null; }
    var m = t.replace('\u2212', '-').match(/^[<>~]?\s*(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)/i);
    return m ? parseFloat(m[1]) : t.toLowerCase();
  }
  function compare(a, b) {
    if (a === null || b === null) { return a === b ? 0 : (a === null ? 1 : -1); }
    if (typeof a === typeof b) { return a < b ? -1 : (a > b ? 1 : 0); }
    return typeof a === 'number' ? -1 : 1;
  }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var heads = table.querySelectorAll('thead th');
    heads.forEach(function (th, column) {
      th.addEventListener('click', function () {
        var order = th.getAttribute('data-order') === 'asc' ? 'desc' : 'asc';
        heads.forEach(function (h) { h.removeAttribute('data-order'); });
        th.setAttribute('data-order', order);
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (r, s) {
          var a = key(r.cells[column] ? r.cells[column].textContent : '');
          var b = key(s.cells[column] ? s.cells[column].textContent : '');
          if (a === null || b === null) { return compare(a, b); }
          return order === 'asc' ? compare(a, b) : compare(b, a);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });

  var tooltip = document.getElementById('tooltip');
  document.querySelectorAll('svg.reliability rect.bin').forEach(function (rect) {
    rect.addEventListener('mousemove', function (event) {
      tooltip.textContent = rect.getAttribute('data-tip');
      tooltip.style.display = 'block';
      tooltip.style.left = (event.clientX + 12) + 'px';
      tooltip.style.top = (event.clientY + 12) + 'px';
    });
    rect.addEventListener('mouseleave', function () { tooltip.style.display = 'none'; });
  });

  var data = document.getElementById('case-data');
  if (!data) { return; }
  var cases = JSON.parse(data.textContent);
  var select = document.getElementById('case-select');
  var slider = document.getElementById('slice');
  var stack = document.getElementById('stack');
  var sliceText = document.getElementById('slice-text');
  var notes = document.getElementById('case-notes');
  var layers = ['image', 'label', 'prediction', 'uncertainty', 'possible', 'sure'];
  var current = null;
  function draw() {
    var index = parseInt(slider.value, 10);
    layers.forEach(function (name) {
      var img = document.getElementById('layer-' + name);
      var found = current.layers[name];
      var box = document.getElementById('show-' + name);
      if (box) { box.disabled = !found; }
      img.style.display = found && (!box || box.checked) ? 'block' : 'none';
      if (found) { img.src = found[index]; } else { img.removeAttribute('src'); }
    });
    stack.setAttribute('data-slice', String(current.slices[index]));
    sliceText.textContent = 'slice ' + current.slices[index] + ' (' + (index + 1) + ' of ' +
      current.slices.length + ' drawn)';
  }
  function choose(i) {
    current = cases[i];
    slider.max = String(current.slices.length - 1);
    slider.value = String(current.start);
    stack.style.width = current.display[0] + 'px';
    stack.style.height = current.display[1] + 'px';
    notes.innerHTML = '';
    current.notes.forEach(function (text) {
      var li = document.createElement('li'); li.textContent = text; notes.appendChild(li);
    });
    draw();
  }
  select.addEventListener('change', function () { choose(parseInt(select.value, 10)); });
  slider.addEventListener('input', draw);
  layers.forEach(function (name) {
    var box = document.getElementById('show-' + name);
    if (box) { box.addEventListener('change', draw); }
  });
  choose(0);
})();
"""
