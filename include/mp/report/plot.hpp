#pragma once
// Line and bar charts and heat maps drawn by gnuplot (PNG), for run logs and `mixprec compare` reports.
#include <string>
#include <vector>

namespace mp::report {

/// A line series for plots.
struct Series {
  std::string title;      ///< legend entry
  std::vector<double> x;  ///< abscissae
  std::vector<double> y;  ///< ordinates (same length as x); NaN/inf points are left out
};

/// Draw line charts with gnuplot into `png_path` (pngcairo if available else png terminal), with title/axis
/// labels, one line per series (series without points are left out of the plot), optional log-scale y
/// (points with y <= 0 are then left out). Writes the data and the script next to the PNG (same stem,
/// .dat/.gp; the script uses relative names: `cd DIR && gnuplot STEM.gp` re-plots) and creates the folder.
/// gnuplot missing: mp::Error "gnuplot not found; install it with: apt-get install gnuplot-nox" (the .dat
/// and .gp files are still written).
void plot_lines(const std::string& png_path, const std::string& title, const std::string& xlabel,
                const std::string& ylabel, const std::vector<Series>& series, bool log_y = false);

/// A bar chart with the value written above each bar: one bar per label (e.g. precision -> seconds).
/// Same files and errors as plot_lines.
void plot_bars(const std::string& png_path, const std::string& title, const std::string& ylabel,
               const std::vector<std::string>& labels, const std::vector<double>& values);

/// A heat map: one row per label (top to bottom), one column per x (evenly spaced, e.g. logged steps),
/// each cell coloured by values[row][column] on a palette with the colour bar labelled `cblabel`; non-finite
/// cells stay blank; `shares`: the values are shares, the colour bar spans [0, 1] (else it fits the values).
/// Same files and errors as plot_lines.
void plot_heatmap(const std::string& png_path, const std::string& title, const std::string& xlabel,
                  const std::string& cblabel, const std::vector<std::string>& rows, const std::vector<double>& x,
                  const std::vector<std::vector<double>>& values, bool shares = false);

/// Whether gnuplot can be run (checked once per process).
bool gnuplot_available();

}  // namespace mp::report
