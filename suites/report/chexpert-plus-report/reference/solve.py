"""Reference solution for chexpert-plus-report: chest X-ray analysis, then a templated report.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.txt' [--cases ID ...]

The reading and the report are cxr_report.py's (its docstring says what is measured and
how each finding is worded); this task picks CheXpert Plus's report style.
"""

from cxr_report import main

if __name__ == "__main__":
    main("chexpert")
