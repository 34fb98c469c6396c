// MathJax 3 configuration for pymdownx.arithmatex (generic mode). The MathJax bundle itself is
// copied into the built site from the django-static-mathjax wheel by docs/_hooks/mathjax_assets.py.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};

// Material's instant navigation is off, so a plain page load typesets once.
