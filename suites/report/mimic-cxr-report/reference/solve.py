"""Reference solution for mimic-cxr-report: classical chest X-ray reading, templated report.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.txt' [--cases ID ...]

The reading and the report are cxr_report.py's (its docstring says what is measured and
how each finding is worded); this task picks MIMIC-CXR's report style.
"""

from cxr_report import main

if __name__ == "__main__":
    main("mimic")
