# written by mixprec; re-plot with: cd 'bench/reports/opt-levels' && gnuplot 'time.gp'
set terminal pngcairo size 1000,620 noenhanced
set output 'time.png'
set title 'training time'
set ylabel 'seconds'
set grid
set datafile missing '?'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.8
set yrange [0:*]
set offsets 0, 0, graph 0.08, 0
set grid noxtics ytics
set xtics rotate by -30
plot 'time.dat' using 2:xtic(1) notitle lc rgb '#4477aa', \
     'time.dat' using 0:2:(sprintf('%.3g', $2)) with labels offset 0,0.8 notitle
