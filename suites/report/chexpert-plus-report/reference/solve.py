"""Reference solution for chexpert-plus-report: chest X-ray analysis, then a templated report.

Usage: python solve.py --inputs PUBLIC --outputs OUT --pattern '{case}.txt' [--cases ID ...]

The frontal view of each study is read at 512 px (the lateral view is not used). The lungs
are the two largest dark regions inside the body; from them the script measures the
cardiothoracic ratio (cardiomegaly above 0.5), blunted costophrenic angles (effusion, per
side), a lucent lateral/apical rim without vessels (pneumothorax), focal bright regions
after subtracting the lung's smooth background (consolidation, patchy opacity, nodules and
masses by size and shape), a perihilar haze on both sides (edema) and thin radiopaque lines
or a generator (support devices). Each positive finding gets one fixed sentence; absent key
findings are stated as negatives ("The lungs are clear.", "No pleural effusion or
pneumothorax.", "Heart size is normal."), as a radiologist's FINDINGS would.
"""

from cxr_report import main

if __name__ == "__main__":
    main("chexpert")
